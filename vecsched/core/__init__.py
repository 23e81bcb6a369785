"""The pure core: arrays, eligibility, competition, figures and the prospective
answer. No I/O, and no import of :mod:`vecsched.service`."""
