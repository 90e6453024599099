"""The ledger's storage (gatelab.sweep.ledger_storage): storage that cannot be a ledger, junk and torn lines in the
journal, secrets and time-outs in messages, and read-only commands that leave the ledger's bytes as they were."""

from __future__ import annotations

import pytest

from gatelab.errors import GatelabError
from gatelab.sweep.queue import SweepLedger, ledger_states
from tests.helpers import POSTGRES_URL, ledger_specs, postgres_database, postgres_reason


def _mlflow_database(path) -> None:
    import sqlite3

    with sqlite3.connect(path) as connection:  # the tables MLflow's schema starts with
        for table in ("experiments", "runs", "metrics"):
            connection.execute(f"CREATE TABLE {table} (id INTEGER)")


@pytest.mark.parametrize("make_storage, fragments", [
    (lambda tmp: str(tmp), ["is a directory", "ledger.journal"]),
    (lambda tmp: str(tmp / "runs" / "mlflow.db"), ["mlflow.db", "MLflow store", "file of its own"]),
    (lambda tmp: f"sqlite:///{tmp / 'runs' / 'mlflow.db'}", ["mlflow.db", "MLflow", "database of its own"]),
    (lambda tmp: f"sqlite:///{tmp / 'other.db'}", ["other.db", "MLflow tracking store", "database of its own"]),
    (lambda tmp: "postgress://user@localhost/ledger", ["postgress://", "unknown scheme", "postgresql://"]),
    (lambda tmp: "sqlite://ledger.db", ["sqlite://ledger.db", "sqlite:///relative/path.db"]),
    (lambda tmp: "sqlite:ledger.db", ["sqlite:ledger.db", "without '//'", "sqlite:///"]),
    (lambda tmp: f"sqlite:///{tmp / 'missing' / 'ledger.db'}", ["ledger.db", "does not exist", "create it"]),
])
def test_storage_that_cannot_be_a_ledger_is_one_message_naming_it_and_the_fix(tmp_path, monkeypatch, make_storage,
                                                                             fragments):
    monkeypatch.chdir(tmp_path)  # a relative sqlite URL must not land in the repository
    (tmp_path / "runs").mkdir()
    _mlflow_database(tmp_path / "other.db")
    storage = make_storage(tmp_path)
    if "mlflow.db" in storage and storage.startswith("sqlite"):
        tracking = storage  # not created yet: the comparison with the tracking URI must catch it
    else:
        _mlflow_database(tmp_path / "runs" / "mlflow.db")
        tracking = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}?timeout=60"
    with pytest.raises(GatelabError) as raised:
        SweepLedger(storage, "s", tracking_uris=[tracking])
    assert all(fragment in str(raised.value) for fragment in fragments), str(raised.value)
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "sqlite:ledger.db").exists()


def test_a_junk_line_in_the_journal_names_the_file_and_the_line_and_keeps_the_ledger(tmp_path):
    path = tmp_path / "ledger.journal"
    ledger, specs = SweepLedger(str(path), "s"), ledger_specs(2)
    ledger.enqueue_missing(specs)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + "<<<<<<< merge conflict\n" + "".join(lines[2:]))
    before = path.read_text()
    with pytest.raises(GatelabError) as raised:
        SweepLedger(str(path), "s").states(specs)
    message = str(raised.value)
    assert str(path) in message and "line 3" in message and "merge conflict" in message and "sed -i.bak '3d'" in message
    assert path.read_text() == before


@pytest.mark.parametrize("change, fragments", [
    (lambda url: url.replace(":5432/", ":5439/"), ["127.0.0.1:5439", "check the host and port"]),
    (lambda url: url.rsplit("/", 1)[0] + "/no_such_gatelab_db", ["'no_such_gatelab_db' does not exist",
                                                                  "createdb"]),
    (lambda url: url.replace("//postgres@", "//no_such_gatelab_user:hunter2@"), ["no_such_gatelab_user",
                                                                                  "user name and password"]),
])
def test_a_postgresql_ledger_error_says_what_failed(change, fragments):
    reason = postgres_reason()
    if reason:
        pytest.skip(reason)
    storage = change(POSTGRES_URL)
    with pytest.raises(GatelabError) as raised:
        SweepLedger(storage, "s")
    message = str(raised.value)
    assert all(fragment in message for fragment in fragments) and "hunter2" not in message, message



def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again on leaving: nothing listens there


@pytest.mark.parametrize("storage, secrets", [
    ("postgresql://postgres:A@B:918273@127.0.0.1:{port}/test", ["918273", "A@B"]),  # the prober's raw '@' and ':'
    ("mysql+pymysql://root:x@y:4401234@127.0.0.1:{port}/ledger", ["4401234", "x@y"]),
    ("postgresql://postgres:A%40B%3A918273@127.0.0.1:{port}/test", ["918273", "A%40B"]),  # encoded: nothing listens
    ("postgresql://postgres:9182736@127.0.0.1:{port}/test", ["9182736"]),  # digits only, as a port looks
    ("postgresql://postgres:pa:ss/w0rd!@127.0.0.1:{port}/test", ["w0rd", "pa:ss"]),  # raw ':' and '/'
    ("postgresql:postgres:hunter2x@127.0.0.1:{port}/test", ["hunter2x"]),  # no '//': not a URL to `redact`
    ("postgresql://postgres:hunter2x@127.0.0.1:notaport/test", ["hunter2x"]),
])
def test_no_ledger_storage_message_holds_any_part_of_the_password(storage, secrets):
    with pytest.raises(GatelabError) as raised:
        SweepLedger(storage.format(port=_closed_port()), "s")
    message = str(raised.value)
    assert "--storage" in message and not any(secret in message for secret in secrets), message
    if storage.count("@") > 1 or "notaport" in storage:
        assert "percent-encode" in message and "%40" in message, message


def test_a_database_that_accepts_and_never_answers_is_given_up_on_saying_what_it_waits_for(monkeypatch, capsys):
    """A port that accepts TCP connections and never answers (a wrong service, a stuck server) waited 136 s silently."""
    import socket
    import threading

    from gatelab.sweep import ledger_storage

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.extend(server.accept() for _ in range(8)), daemon=True).start()
    monkeypatch.setattr(ledger_storage, "LEDGER_CONNECT_TIMEOUT_S", 2)  # libpq's smallest
    monkeypatch.setattr(ledger_storage, "WAIT_NOTE_AFTER_S", 0.2)
    storage = f"postgresql://postgres:hunter2x@127.0.0.1:{server.getsockname()[1]}/test"
    try:
        with pytest.raises(GatelabError) as raised:
            SweepLedger(storage, "s")
    finally:
        server.close()
    message, waited = str(raised.value), capsys.readouterr().err
    assert "did not answer within 2 s" in message and "127.0.0.1" in message and "--storage" in message, message
    assert "waiting for the ledger database at 127.0.0.1" in waited and "up to 2 s" in waited, waited
    assert "hunter2x" not in message + waited and accepted  # it did connect: the wait was for an answer


def _journal_ledger(folder, damage: str | None = None):
    """A journal ledger with a finished run, a claimed one and a waiting one; `damage` appended or inserted."""
    path = folder / "ledger.journal"
    ledger, specs = SweepLedger(str(path), "s"), ledger_specs(3)
    ledger.enqueue_missing(specs)
    ledger.finish(ledger.claim(), "finished", "run-id", 2.0)
    ledger.claim()
    if damage == "torn":  # a writer killed mid-write leaves part of a line, without its newline
        with path.open("ab") as journal:
            journal.write(b'{"op_code":8,"worker_id":"d7c1-')
    elif damage == "junk last":  # a whole line of other text at the end (an editor, a shell's `>>`): Optuna skips it
        with path.open("ab") as journal:
            journal.write(b"<<<<<<< HEAD\n")
    elif damage == "junk":
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[:3]) + "<<<<<<< HEAD\n" + "".join(lines[3:]))
    return path, specs


@pytest.mark.parametrize("damage", [None, "torn", "junk", "junk last"])
def test_reading_the_ledger_writes_nothing_to_it_even_read_only_or_damaged(tmp_path, damage):
    path, specs = _journal_ledger(tmp_path, damage)
    before = path.read_bytes()
    path.chmod(0o444)
    tmp_path.chmod(0o555)  # a read-only copy: not even a lock file could be made beside it
    try:
        if damage == "junk":
            with pytest.raises(GatelabError, match="line 4 is not a ledger entry"):
                ledger_states(str(path), tmp_path, "s", specs)
        else:
            statuses = [state.status for state in ledger_states(str(path), tmp_path, "s", specs)]
            assert statuses == ["finished", "running", "pending"]
    finally:
        tmp_path.chmod(0o755)
        path.chmod(0o644)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["ledger.journal"]


def test_reading_a_sqlite_ledger_writes_nothing_to_it(tmp_path):
    path = tmp_path / "ledger.db"
    ledger, specs = SweepLedger(f"sqlite:///{path}", "s"), ledger_specs(2)
    ledger.enqueue_missing(specs)
    before = path.read_bytes()
    assert [s.status for s in ledger_states(f"sqlite:///{path}", tmp_path, "s", specs)] == ["pending", "pending"]
    assert [s.status for s in ledger_states(f"sqlite:///{path}", tmp_path, "other", specs)] == ["not started"] * 2
    assert path.read_bytes() == before


def test_a_torn_last_line_is_named_as_such_and_set_aside_by_the_next_write(tmp_path, capsys):
    from gatelab.sweep.ledger_storage import torn_tail_note

    path, specs = _journal_ledger(tmp_path, "torn")
    whole = path.read_bytes().rsplit(b"\n", 1)[0] + b"\n"
    note = torn_tail_note(str(path))
    assert "torn write" in note and str(path) in note and "ledger.journal.torn" in note
    ledger = SweepLedger(str(path), "s")  # a writer: the next entry must not join the torn bytes
    ledger.claim()
    assert capsys.readouterr().err.count("torn write") == 1
    assert path.read_bytes().startswith(whole) and path.read_bytes().endswith(b"\n")
    assert (tmp_path / "ledger.journal.torn").read_bytes() == b'{"op_code":8,"worker_id":"d7c1-\n'  # kept, not lost
    assert [state.status for state in SweepLedger(str(path), "s").states(specs)] == ["finished", "running", "running"]
    assert torn_tail_note(str(path)) is None


def test_a_last_line_of_other_text_is_named_by_a_read_only_command_and_set_aside_by_the_next_write(tmp_path, capsys):
    """Optuna skips an unreadable last line silently; the next entry appended after it would stop every reader there
    (issue 45: `gatelab sweep status` said nothing about it)."""
    from gatelab.sweep.ledger_storage import torn_tail_note

    path, specs = _journal_ledger(tmp_path, "junk last")
    whole = path.read_bytes()[: -len(b"<<<<<<< HEAD\n")]
    note = torn_tail_note(str(path))
    assert "ends in text that is not a ledger entry" in note and "13 bytes" in note and "skipped here" in note
    assert str(path) in note
    assert [state.status for state in SweepLedger(str(path), "s").states(specs)] == ["finished", "running", "pending"]
    SweepLedger(str(path), "s").claim()  # a writer
    assert "its last line, text that is not a ledger entry" in capsys.readouterr().err
    assert path.read_bytes().startswith(whole)
    assert (tmp_path / "ledger.journal.torn").read_bytes() == b"<<<<<<< HEAD\n"  # kept, not lost
    assert [state.status for state in SweepLedger(str(path), "s").states(specs)] == ["finished", "running", "running"]
    assert torn_tail_note(str(path)) is None


def test_a_torn_write_joined_to_the_next_entry_is_named_with_the_command_that_splits_it(tmp_path):
    import subprocess

    path, specs = _journal_ledger(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    whole = "".join(lines)
    lines[4] = lines[4][:25] + lines[4]  # what Optuna's own append does after a torn write
    path.write_text("".join(lines))
    with pytest.raises(GatelabError) as raised:
        SweepLedger(str(path), "s", read_only=True)
    message = str(raised.value)
    assert "line 5 is a torn write" in message and "something other than gatelab" not in message, message
    command = message.split("`")[1]
    subprocess.run(command, shell=True, check=True)  # the fix, as a user would paste it
    assert path.read_text() == whole


def test_a_ledger_that_fails_in_use_is_one_message_naming_the_storage(tmp_path):
    path = tmp_path / "ledger.db"
    ledger = SweepLedger(f"sqlite:///{path}", "s")
    ledger.enqueue_missing(ledger_specs(1))
    path.write_bytes(b"not a database, overwritten under the worker" * 100)
    with pytest.raises(GatelabError) as raised:
        ledger.claim()
    message = str(raised.value)
    assert f"--storage sqlite:///{path}" in message and "run the same command again" in message, message


@pytest.fixture
def fresh_database():
    with postgres_database("gatelab_race") as url:
        yield url


def test_workers_opening_a_new_postgresql_ledger_at_once_all_get_it(fresh_database):
    """Four `sweep worker`s started together on an empty database (a Slurm array, one a machine): three died with
    'duplicate key value violates unique constraint "pg_type_typname_nsp_index"' as they raced to make Optuna's
    tables. Every one must open the ledger, and the sweep's runs be enqueued once."""
    import threading

    barrier, opened, failed = threading.Barrier(8), [], []

    def open_at_once():
        barrier.wait()
        try:
            opened.append(SweepLedger(fresh_database, "race"))
        except GatelabError as error:
            failed.append(str(error))

    threads = [threading.Thread(target=open_at_once) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == [] and len(opened) == 8
    specs = ledger_specs(3)
    for ledger in opened[:2]:
        ledger.enqueue_missing(specs)
    assert [state.status for state in ledger_states(fresh_database, None, "race", specs)] == ["pending"] * 3


def test_a_ledger_database_without_the_right_to_create_tables_is_answered_at_once(fresh_database, monkeypatch):
    """"permission denied for schema public" is no race to wait out: it is said after one try, not after the schema
    race's retries (about 5 s of them)."""
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    from gatelab.sweep import ledger_storage

    role = f"gatelab_no_create_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_database, autocommit=True) as connection:
        connection.execute(f'CREATE ROLE "{role}" LOGIN')  # PostgreSQL 15 grants no CREATE on schema public to it
    try:
        url = make_url(fresh_database).set(username=role).render_as_string(hide_password=False)
        opened, open_storage = [], ledger_storage.RDBStorage
        monkeypatch.setattr(ledger_storage, "RDBStorage", lambda *a, **k: opened.append(a) or open_storage(*a, **k))
        with pytest.raises(GatelabError, match="permission denied for schema public"):
            SweepLedger(url, "denied")
        assert len(opened) == 1
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f'DROP ROLE IF EXISTS "{role}"')
