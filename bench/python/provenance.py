"""Where a benchmark's figures come from: the commit they were measured at.

    from provenance import commit_of
    record["commit"] = commit_of(args.commit)   # the given one, else git's, else None
"""

import os
import subprocess


def commit_of(given=None):
    """``given`` when set (a device machine without the repository's history reads it from
    .deps/COMMIT), else ``git describe`` of this checkout, else None."""
    if given:
        return given
    try:
        done = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                               "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
