"""gatelab.host: what the program and the machine it runs on are."""

from __future__ import annotations


def test_a_programs_start_is_its_first_import_of_gatelab_not_the_process_that_became_it(tmp_path):
    """Under `bash -c 'sleep ... && gatelab ...'` bash execs gatelab in its own process: time/import_s counted the
    sleep (pip, in the issue). The same exec here: a process that sleeps 3 s, then becomes Python."""
    import subprocess
    import sys

    program = "import gatelab.host as h; print(h.seconds_since_start())"
    result = subprocess.run(["bash", "-c", f"sleep 3 && exec {sys.executable} -c '{program}'"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert 0 <= float(result.stdout) < 2.5  # the 3 s before Python are not the program's
