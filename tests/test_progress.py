"""Stage lines: printed once inside `printed()`, even where a handler on the
root logger would print them too; quiet and untouched outside it."""

from __future__ import annotations

import io
import logging

from static_keras import progress


def test_stage_lines_are_printed_once_and_the_logger_is_restored():
    root_stream = io.StringIO()
    root_handler = logging.StreamHandler(root_stream)
    root = logging.getLogger()
    root.addHandler(root_handler)
    old_level = root.level
    root.setLevel(logging.INFO)  # as absl's handler or basicConfig(INFO) would
    try:
        out = io.StringIO()
        with progress.printed(out):
            with progress.stage("merging"):
                pass
        lines = out.getvalue().splitlines()
        assert len(lines) == 2
        assert lines[0].endswith("merging ...") and "merging: done in" in lines[1]
        assert root_stream.getvalue() == ""  # not a second time through the root
        assert progress.logger.propagate and progress.logger.level == logging.NOTSET
        # Outside `printed`, a script that logs at INFO sees the stages itself.
        with progress.stage("writing"):
            pass
        assert "writing ..." in root_stream.getvalue()
    finally:
        root.removeHandler(root_handler)
        root.setLevel(old_level)
