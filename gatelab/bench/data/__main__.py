"""`python -m gatelab.bench.data rss KIND CORPUS_DIR STEPS`: the data bench's peak-RSS child process
(`peak_rss.run_rss_child` starts it); the bench itself is `gatelab bench --data`."""

import sys

from gatelab.bench.data.peak_rss import child_main

if __name__ == "__main__":
    child_main(sys.argv[1:])
