"""No secret in any text gatelab prints, and one line (never a traceback) for any failure."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from gatelab.errors import GatelabError, exit_code, failure_message, redact
from tests.helpers import REPO

# (text holding a secret, the secret's parts that must go, what must still be shown)
SECRET_FORMS = [
    ("postgresql://postgres:hunter@2secret@127.0.0.1/test", ["hunter", "2secret"], "postgres:***@127.0.0.1/test"),
    ("http://admin:TopSecret99@127.0.0.1:9", ["TopSecret99"], "admin:***@127.0.0.1:9"),
    # a driver that splits the raw-@ URI at its first "@" names `2secret@127.0.0.1` as the host
    ("ledger postgresql://postgres:hunter@2secret@127.0.0.1:9/test: cannot resolve host '2secret@127.0.0.1'",
     ["hunter", "2secret"], "127.0.0.1"),
    ("mysql://root:p:a:ss@db.example.com:3306/x", ["p:a:ss", ":a:"], "root:***@db.example.com:3306/x"),
    ("s3://AKIAXYZ:wJalr/K7MDENG+bPx@bucket/key", ["wJalr", "K7MDENG"], "@bucket/key"),
    ("redis://:onlyPassw0rd@cache:6379/0", ["onlyPassw0rd"], "cache:6379/0"),
    ("error: cannot connect to 'postgresql://u:s3cr3t@db.internal/x' (timed out)", ["s3cr3t"], "db.internal"),
    ('Traceback (most recent call last):\n  File "x.py", line 3\nValueError: sqlite+pysqlite://u:pw1234@localhost/x\n',
     ["pw1234"], "localhost"),
    ("https://mlflow.example/api?password=hunter2&x=1", ["hunter2"], "mlflow.example/api?password=***&x=1"),
    ("https://mlflow.example/api?a=1&token=abcDEF123", ["abcDEF123"], "mlflow.example"),
    ("https://mlflow.example/api?pwd=pa55&user=me", ["pa55"], "user=me"),
    ("https://mlflow.example/api?client_secret=zzTop9&b=2", ["zzTop9"], "mlflow.example"),
    ("https://blob.example/f?sv=1&api_key=K3Y-value", ["K3Y-value"], "blob.example"),
    ("https://bucket.s3.example/o?X-Amz-Signature=d34db33f&X-Amz-Date=1", ["d34db33f"], "bucket.s3.example"),
    ("host=db.internal port=5432 password=hunter22 dbname=test", ["hunter22"], "host=db.internal"),
]


@pytest.mark.parametrize("text, secrets, shown", SECRET_FORMS, ids=[form[0][:40] for form in SECRET_FORMS])
def test_redact_hides_every_form_of_secret_and_keeps_the_host(text, secrets, shown):
    redacted = redact(text)
    assert not [secret for secret in secrets if secret in redacted], redacted
    assert shown in redacted


def test_redact_hides_a_key_parameter_beside_the_mlflow_ui_parameters():
    url = "http://host:5000/#/experiments/1/runs?orderByKey=metrics.x&apikey=Xy9pa55word&viewStateShareKey=view"
    assert redact(url) == "http://host:5000/#/experiments/1/runs?orderByKey=metrics.x&apikey=***&viewStateShareKey=view"


@pytest.mark.parametrize("name", ["PGPASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                                  "AWS_SECRET_ACCESS_KEY", "MY_SERVICE_TOKEN", "DB_PASSWORD_FILE_CONTENT"])
def test_redact_hides_the_values_of_secret_environment_variables(monkeypatch, name):
    monkeypatch.setenv(name, "Xy9-pa55/word")
    redacted = redact("FATAL: password authentication failed (Xy9-pa55/word, Xy9-pa55%2Fword) on db1.internal")
    assert "pa55" not in redacted and "db1.internal" in redacted


@pytest.mark.parametrize("text", ["postgresql://postgres@127.0.0.1:5432/test", "http://127.0.0.1:5000/#/experiments/1",
                                  "http://127.0.0.1:4873/@scope%2fpkg", "train.max_tokens=4096 d_model 4096 true",
                                  "http://127.0.0.1:5000/#/experiments/1/runs?viewStateShareKey=gatelab-key-metrics"
                                  "&orderByKey=metrics.%60ppl%2Favg%60"])
def test_redact_leaves_text_without_secrets_alone(monkeypatch, text):
    monkeypatch.setenv("MAX_TOKENS", "4096")
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "true")
    assert redact(text) == text


@pytest.mark.parametrize("error, expected", [
    (OSError(errno.ENOSPC, "No space left on device", "runs/m/last.ckpt"),
     "the disk holding runs/m/last.ckpt (the file system mounted at /"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "runs/m/last.ckpt"), "the disk holding runs/m/last.ckpt (the file"),
    (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/runs"), "/mnt/ro/runs is on a read-only file system"),
    (PermissionError(errno.EACCES, "Permission denied", "results/x"), "results/x is read-only or not writable"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "data/shard.bin"),
     "data/shard.bin: No such file or directory"),
    (RuntimeError("cannot reach http://admin:TopSecret99@127.0.0.1:9\nsecond line"),
     "RuntimeError: cannot reach http://admin:***@127.0.0.1:9 (set GATELAB_DEBUG=1 for the traceback)"),
    (GatelabError("ledger storage postgresql://postgres:hunter@2secret@127.0.0.1/test: cannot connect"),
     "ledger storage postgresql://postgres:***@127.0.0.1/test: cannot connect"),
])
def test_failure_message_is_one_redacted_line_naming_the_file(error, expected):
    message = failure_message(error)
    assert message.startswith(expected) and "\n" not in message


def test_a_full_disk_names_the_file_its_file_system_and_the_room_left(tmp_path):
    import os

    mount = tmp_path
    while not os.path.ismount(mount):
        mount = mount.parent
    where = tmp_path / "runs" / "m" / "last.ckpt"  # not there yet: its nearest folder tells the file system
    message = failure_message(OSError(errno.ENOSPC, "No space left on device", str(where)))
    assert message.startswith(f"the disk holding {where} (the file system mounted at {mount}: "), message
    assert " free) is full: free space and run the same command again" in message


@pytest.mark.parametrize("error, code", [
    (GatelabError("train.lr: ..."), 2),
    (OSError(errno.EROFS, "Read-only file system", "runs/micro"), 2),  # a read-only runs folder exited 1
    (PermissionError(errno.EACCES, "Permission denied", "runs/mlflow.db"), 2),
    (OSError(errno.ENOSPC, "No space left on device"), 2),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "data/shard.bin"), 2),
    (RuntimeError("a bug"), 1),
    (OSError(errno.ECONNRESET, "Connection reset by peer"), 1),
])
def test_every_user_error_exits_2_files_and_disks_included(error, code):
    assert exit_code(error) == code


LEAKY_PROGRAM = """
import logging, sys, warnings
from gatelab import cli

def leak(*args, **kwargs):
    logging.getLogger("mlflow").warning("connecting to %s", "http://admin:TopSecret99@127.0.0.1:9")
    logging.getLogger("sqlalchemy.engine").error("postgresql://postgres:hunter@2secret@127.0.0.1/test")
    warnings.warn("retrying http://admin:TopSecret99@127.0.0.1:9")
    sys.stdout.write("View run at: http://admin:TopSecret99@127.0.0.1:9/#/experiments/1\\n")
    raise ConnectionError("API request to http://admin:TopSecret99@127.0.0.1:9/api failed\\nHTTPConnectionPool")

logging.basicConfig()
cli.show_plan = leak  # what `gatelab sweep plan` calls
cli.main()
"""


@pytest.mark.parametrize("debug", ["0", "1"])
def test_boundary_redacts_logs_warnings_prints_and_the_escaping_exception(tmp_path, debug):
    result = subprocess.run([sys.executable, "-c", LEAKY_PROGRAM, "sweep", "plan", "any.yaml"], capture_output=True,
                            text=True, timeout=60, env={"GATELAB_DEBUG": debug, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "TopSecret99" not in output and "2secret" not in output and "hunter" not in output, output
    assert "127.0.0.1:9" in output
    assert ("Traceback" in output) == (debug == "1"), output
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ConnectionError: API request to http://admin:***@127.0.0.1:9/api failed")
    assert "GATELAB_DEBUG=1" in last_line
