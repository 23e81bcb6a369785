"""The command line fails in one line (never a traceback unless --debug), and explains itself."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vecsched
from vecsched.cli import build_parser, main
from vecsched.synthetic import horde

PG_UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def one_line_failure(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 1) -> str:
    """Run ``vecsched argv``; assert it exits ``code`` with exactly one line on stderr; that line."""
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        got = exc.code
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_dump_into_a_missing_folder(capsys, tmp_path: Path) -> None:
    assert main(["db", "init", "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"]) == 0
    line = one_line_failure(capsys, ["db", "dump", "-o", str(tmp_path / "missing-dir" / "x.json"),
                                     "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"])
    assert "No such file or directory" in line and "missing-dir" in line


def test_unreachable_redis(capsys, tmp_path: Path) -> None:
    line = one_line_failure(capsys, ["status", "x", "--redis", "redis://127.0.0.1:1/0"])
    assert line.startswith("vecsched: cannot reach Redis") and "127.0.0.1:1" in line


def test_unreachable_database(capsys) -> None:
    line = one_line_failure(capsys, ["db", "init", "--db", PG_UNREACHABLE])
    assert line.startswith("vecsched: database error") and "127.0.0.1" in line


@pytest.mark.parametrize("argv, says", [
    (["db", "init", "--db", "not a url"], "bad database URL"),
    (["db", "init", "--db", "nosuchdialect://h/x"], "bad database URL"),
    (["run", "--once", "--no-demo", "--db", "postgresql://u:s3cret@db:port/horde"], "bad database URL"),
    (["status", "x", "--redis", "redis://:s3cret@127.0.0.1:99999/0"], "bad Redis URL"),
    (["status", "x", "--redis", "http://u:s3cret@127.0.0.1/0"], "bad Redis URL"),
    (["promotion", "--db", "not a url"], "bad database URL"),
    (["promotion", "--redis", "redis://:s3cret@127.0.0.1:99999/0"], "bad Redis URL"),
])
def test_a_malformed_url_is_a_usage_error_that_keeps_its_password(capsys, argv, says) -> None:
    line = one_line_failure(capsys, argv, code=2)
    assert says in line and "s3cret" not in line


def test_a_malformed_redis_url_from_the_environment_is_a_usage_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:notaport/0")
    assert "bad Redis URL" in one_line_failure(capsys, ["status", "x"], code=2)


def test_missing_postgres_driver_names_the_extra(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails as if not installed
    line = one_line_failure(capsys, ["db", "init", "--db", PG_UNREACHABLE])
    assert "vecsched[postgres]" in line


def test_bad_json_argument(capsys) -> None:
    line = one_line_failure(capsys, ["prospective", "--request", "notjson"], code=2)
    assert "--request" in line and "not JSON" in line


@pytest.mark.parametrize("argv", [["synth", "--requests", "-1", "-o", "x.json"],
                                  ["synth", "--workers", "many", "-o", "x.json"],
                                  ["run", "--interval", "0"],
                                  ["run", "--interval", "1e300"],  # once overflowed the scheduler's int
                                  ["run", "--replay-every", "1e300"],
                                  ["run", "--stall-refresh", "-1"],
                                  ["top", "-n", "-3"],
                                  ["serve", "--port", "70000"],  # once logged "serving on ...:70000", then overflowed
                                  ["serve", "--port", "-1"],
                                  ["simulate", "steady", "--every", "0"],  # once a ZeroDivisionError
                                  ["simulate", "steady", "--minutes", "nan"],
                                  ["simulate", "steady", "--minutes", "-1"],  # once exit 0 and an empty table
                                  ["synth", "--now", "garbage", "-o", "x.json"],
                                  ["synth", "--now", "2026-11-29T12:00:00", "-o", "x.json"],  # no zone
                                  ["db", "dump", "--now", "garbage", "-o", "x.json"],
                                  ["db", "load", "x.json", "--shift-to-now", "--keep-times"]])
def test_out_of_range_number(capsys, argv: list[str]) -> None:
    # (the name is historical: every argument argparse can judge alone, numbers, times and pairs of flags)
    line = one_line_failure(capsys, argv, code=2)
    assert "error: argument" in line


def test_unknown_request_in_status_exits_non_zero(capsys, tmp_path: Path, make_estimates) -> None:
    from vecsched.service.job import run_cycle
    from vecsched.service.store.sql import SQLStore

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    now = time.time()
    run_cycle(lambda t: horde(workers=5, requests=20, seed=1, now=t), SQLStore(url), lambda: now)
    assert main(["status", "abc", "--db", url]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["unknown"] is True
    assert err.strip() == "vecsched: no request abc in the current cycle (list them with vecsched top)"


def test_status_before_any_cycle(capsys, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.sqlite'}"
    assert main(["db", "init", "--db", url]) == 0
    line = one_line_failure(capsys, ["status", "abc", "--db", url])
    assert "no cycle was published yet" in line


@pytest.mark.parametrize("argv", [["status", "abc"], ["top"], ["prospective"], ["db", "check"],
                                  ["db", "dump", "-o", "x.json"], ["promotion"]])
def test_a_reader_never_makes_the_sqlite_file_it_was_pointed_at(capsys, tmp_path: Path, argv) -> None:
    # Opening SQLite creates the file: a reader in the wrong directory left an empty one behind.
    missing = tmp_path / "elsewhere" / "vecsched.sqlite"
    missing.parent.mkdir()
    line = one_line_failure(capsys, [*argv, "--db", f"sqlite:///{missing}"])
    assert f"no database at {missing}" in line and not missing.exists()


def test_a_missing_home_directory_is_named(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("VECSCHED_DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("VECSCHED_HOME", str(tmp_path / "nowhere"))
    line = one_line_failure(capsys, ["run", "--once"])
    assert str(tmp_path / "nowhere" / "vecsched.sqlite") in line and "directory does not exist" in line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    assert main(["db", "init", "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"]) == 0
    with pytest.raises(FileNotFoundError):
        main(["--debug", "db", "dump", "-o", str(tmp_path / "missing-dir" / "x.json"),
              "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"])


def test_no_traceback_reaches_a_real_terminal(tmp_path: Path) -> None:
    assert main(["db", "init", "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"]) == 0
    result = subprocess.run(
        [sys.executable, "-m", "vecsched", "db", "dump", "-o", str(tmp_path / "missing" / "x.json"),
         "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- loading old snapshots ------------------------------------------------------------------------


def test_db_load_refuses_an_old_snapshot_naming_shift_to_now(capsys, tmp_path: Path) -> None:
    src = tmp_path / "old.json"
    horde(workers=10, requests=50, seed=2, now=time.time() - 2 * 3600).to_json(src)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    line = one_line_failure(capsys, ["db", "load", str(src), "--db", url])
    assert "--shift-to-now" in line
    from vecsched.service.sql import is_empty, make_engine

    assert is_empty(make_engine(url))  # refused: nothing written
    assert main(["db", "load", str(src), "--db", url, "--shift-to-now"]) == 0
    assert not is_empty(make_engine(url))


def test_db_load_takes_a_recent_snapshot_as_it_is(capsys, tmp_path: Path) -> None:
    src = tmp_path / "recent.json"
    horde(workers=10, requests=50, seed=2, now=time.time() - 1800).to_json(src)
    assert main(["db", "load", str(src), "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"]) == 0


def test_synth_now_stamps_the_current_time(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    before = time.time()
    assert main(["synth", "--workers", "5", "--requests", "10", "--now", "-o", str(out)]) == 0
    assert before - 1 <= vecsched.load_snapshot(out).now <= time.time() + 1
    assert main(["synth", "--workers", "5", "--requests", "10", "--now", "2030-01-01T00:00:00Z",
                 "-o", str(out)]) == 0
    assert vecsched.load_snapshot(out).to_dict()["now"] == "2030-01-01T00:00:00Z"


# -- help and version -----------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser, path: str = "vecsched"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_help_and_shows_its_default() -> None:
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{path} {action.dest} has no help"
            if action.option_strings and action.default not in (None, False):
                assert f"(default: {action.default})" in " ".join(text.split()), (path, action.dest)


def test_enumerations_list_their_choices(capsys) -> None:
    for argv in (["prospective", "--help"], ["top", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "{text,image}" in capsys.readouterr().out


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("vecsched ")


@pytest.mark.parametrize("url", ["postgresql+psycopg://u:s3cret@127.0.0.1:1/db", "redis://:s3cret@127.0.0.1:1/0"])
def test_a_password_in_a_url_never_reaches_the_error_line(capsys, url: str) -> None:
    # Well-formed URLs of servers that do not answer; malformed ones are usage errors (above).
    argv = ["status", "x", "--redis", url] if url.startswith("redis") else ["db", "init", "--db", url]
    line = one_line_failure(capsys, argv)
    assert "s3cret" not in line


@pytest.mark.parametrize(("argv", "refresh"), [([], 60.0), (["--stall-refresh", "15"], 15.0),
                                               (["--stall-refresh", "0"], 0.0)])
def test_run_hands_its_stall_refresh_to_the_job(tmp_path: Path, monkeypatch, argv: list[str], refresh: float) -> None:
    import vecsched.service.job as job

    seen = {}
    monkeypatch.setattr(job, "run_service", lambda *args, **kwargs: seen.update(kwargs))
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    assert main(["run", "--no-demo", "--no-seed", "--db", url, "--redis", "", *argv]) == 0
    assert seen["stall_refresh"] == refresh


def test_serve_refuses_a_port_another_server_listens_on(capsys, tmp_path: Path) -> None:
    # granian binds with port reuse: a second serve on a busy port started without a word, and
    # clients got answers from the two servers (two stores) in turn.
    import socket

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as granian's own listener
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_failure(capsys, ["serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'h.sqlite'}"])
    assert f"--port {port}" in line and "in use" in line


def test_top_shows_a_stale_cycle_and_exits_one(capsys, tmp_path: Path) -> None:
    # top showed a stopped job's last figures with exit 0 and no mark, while status said stale.
    from vecsched.service.job import run_cycle
    from vecsched.service.store.sql import SQLStore

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    then = time.time() - 3600
    run_cycle(lambda t: horde(workers=5, requests=20, seed=1, now=t), SQLStore(url), lambda: then)
    assert main(["top", "--db", url]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("cycle ") and "stale" in err and "3600 s old" in err
    assert main(["top", "--db", url, "--max-age", "1e9"]) == 0
