"""Every code block in README.md and docs/*.md runs as written.

The blocks run in an empty temporary folder, in fresh processes, with the
`static-keras` of this environment on PATH: each snippet makes the data it
needs. A docs page is a tutorial, so its blocks run in order in one process
(a `bash` block runs in a shell from there, at its place); each README block
is an independent example and runs alone.

Every fenced block names its language: `python` and `bash` run; `text` is a
diagram or an output listing and does not. A block that cannot run here
(`docker run`, a Kubernetes manifest, the install command CI itself runs)
carries, on the line right above its fence,

    <!-- docs-test: skip (why) -->

and the reason is required. Keep those few.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md")
)  # fmt: skip
_FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
_SKIP = re.compile(r"<!-- docs-test: skip \((?P<why>[^)]+)\) -->\s*$")


def code_blocks(page: str) -> list[tuple[str, str, str | None]]:
    """`(language, code, skip reason)` of every fenced block of a page."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as file:
        text = file.read()
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        blocks.append((match["lang"].strip(), match["code"], skip["why"] if skip else None))
    return blocks


def test_every_block_names_a_language_and_every_skip_a_reason():
    for page in PAGES:
        for lang, code, skip in code_blocks(page):
            first = code.splitlines()[0] if code else ""
            assert lang in ("python", "bash", "text", "yaml"), (
                f"{page}: a block has language {lang!r} (first line {first!r}): name it "
                "python, bash, or text for diagrams and listings"
            )
            if lang == "yaml":
                assert skip, f"{page}: a yaml block must say why it cannot run ({first!r})"


def _script(blocks) -> str:
    """One Python program that runs `blocks` in order (bash through a shell)."""
    parts = ["import subprocess as _subprocess\n"]
    for lang, code, _ in blocks:
        if lang == "python":
            parts.append(code)
        else:
            parts.append(
                f"_subprocess.run(['bash', '-e', '-c', {code!r}], check=True)\n"
            )  # fmt: skip
    return "\n".join(parts)


def _runnable(page: str) -> list[list[tuple[str, str, str | None]]]:
    """The groups of blocks that run in one process each."""
    blocks = [b for b in code_blocks(page) if b[0] in ("python", "bash") and b[2] is None]
    if not blocks:
        return []
    return [[b] for b in blocks] if page == "README.md" else [blocks]


CASES = [
    pytest.param(page, group, id=f"{page}:{i}")
    for page in PAGES
    for i, group in enumerate(_runnable(page))
]


@pytest.mark.slow
@pytest.mark.parametrize("page,group", CASES)
def test_code_block_runs_as_written(page, group, tmp_path):
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONPATH", None)  # the installed package, as a reader has it
    script = tmp_path / "snippet.py"
    script.write_text(_script(group), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
        timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, (
        f"{page} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
