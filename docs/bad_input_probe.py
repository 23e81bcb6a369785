"""Operator's-worst-day probe: run with PYTHONPATH=<tree>; prints one line per case."""
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

logging.disable(logging.CRITICAL)
from vecsched.service import sql as _sql
from vecsched.service.job import SQLLoader, run_cycle
from vecsched.service.store.sql import SQLStore
from vecsched.synthetic import horde

tmp = tempfile.mkdtemp()
snap = horde(workers=50, requests=500, seed=9)
base = os.path.join(tmp, "base.sqlite")
e = _sql.make_engine("sqlite:///" + base); _sql.import_snapshot(e, snap); e.dispose()
w = snap.workers.id.tolist(); r = snap.requests.id.tolist()
CASES = [
    ("threads='abc'", f"update workers set threads='abc' where id='{w[3]}'"),
    ("speed='fast'", f"update workers set speed='fast' where id='{w[4]}'"),
    ("n='two'", f"update waiting_prompts set n='two' where id='{r[3]}'"),
    ("n=x'00ff'", f"update waiting_prompts set n=x'00ff' where id='{r[4]}'"),
    ("invalid UTF-8 text", f"update workers set bridge_agent=cast(x'fffe41' as text) where id='{w[5]}'"),
    ("lone-surrogate id", f"update waiting_prompts set id=cast(x'eda080' as text) where id='{r[5]}'"),
    ("threads=3.7", f"update workers set threads=3.7 where id='{w[6]}'"),
    ("n=2.5", f"update waiting_prompts set n=2.5 where id='{r[6]}'"),
    ("maintenance='yes'", f"update workers set maintenance='yes' where id='{w[7]}'"),
    ("priority=-2**63", f"update waiting_prompts set extra_priority=-9223372036854775808 where id='{r[7]}'"),
    ("priority=1e300", f"update waiting_prompts set extra_priority=1e300 where id='{r[8]}'"),
]
for k, (name, stmt) in enumerate(CASES):
    path = os.path.join(tmp, f"c{k}.sqlite"); shutil.copy(base, path)
    with sqlite3.connect(path) as c: c.execute(stmt)
    rep = run_cycle(SQLLoader("sqlite:///" + path), SQLStore("sqlite://"), lambda: snap.now)
    print(f"{name:22s} ok={rep.ok} rejected={len(rep.rejected)} {'; '.join(str(x.field)+': '+x.message for x in rep.rejected)[:70]} {(rep.error or '')[:70]}")
# replaced file
a, b = os.path.join(tmp, "vecsched.sqlite"), os.path.join(tmp, "other.sqlite")
shutil.copy(base, a)
o = horde(workers=10, requests=50, seed=2); e = _sql.make_engine("sqlite:///" + b); _sql.import_snapshot(e, o); e.dispose()
loader, store = SQLLoader("sqlite:///" + a), SQLStore("sqlite:///" + a)
r1 = run_cycle(loader, store, lambda: snap.now); os.remove(a)
r2 = run_cycle(loader, store, lambda: snap.now + 1); os.replace(b, a)
r3 = run_cycle(loader, store, lambda: snap.now + 2)
print(f"rm then mv other       after rm: ok={r2.ok} workers={r2.workers} {(r2.error or '')[:60]}; after mv: ok={r3.ok} workers={r3.workers} (other has 10)")
# logs
res = subprocess.run([sys.executable, "-m", "vecsched", "run", "--once", "--db", "postgresql+psycopg://postgres:PASSWORD@127.0.0.1:1/test"], capture_output=True, text=True)
print("password in log       ", "PASSWORD" in res.stderr)
path = os.path.join(tmp, "ids.sqlite"); shutil.copy(base, path)
with sqlite3.connect(path) as c: c.execute(f"update waiting_prompts set n=-1 where id in ('{r[1]}', '{r[2]}')")
rep = run_cycle(SQLLoader("sqlite:///" + path), SQLStore("sqlite://"), lambda: snap.now)
print("ids in INFO line      ", r[1] in rep.line() or r[2] in rep.line(), "| both named:", r[1] in rep.line() and r[2] in rep.line())
# estimate CLI
doc = snap.to_dict()
def cli(text, *extra):
    p = os.path.join(tmp, "s.json"); open(p, "wb").write(text.encode("utf-8", "surrogatepass"))
    res = subprocess.run([sys.executable, "-m", "vecsched", "estimate", p, *extra], capture_output=True, text=True)
    return res.returncode, "Traceback" in res.stderr, len(res.stderr.strip().splitlines())
print("deep JSON             ", cli('{"format": "vecsched.snapshot/1", "x": ' + "[" * 3000 + "]" * 3000 + "}"))
for now in ("NaN", "Infinity", "1e400"):
    print(f"now={now:18s}", cli(json.dumps(doc).replace(json.dumps(doc["now"]), now, 1)))
print("-o missing folder     ", cli(json.dumps(doc), "-o", os.path.join(tmp, "nope", "x.json")))
d2 = snap.to_dict(); d2["requests"][0]["id"] = "r\ud800"
print("lone surrogate id     ", cli(json.dumps(d2), "-o", os.path.join(tmp, "out.json")))
