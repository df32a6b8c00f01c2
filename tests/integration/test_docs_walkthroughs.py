"""Every code block of README.md and docs/guide.md runs, as written, against a real server.

The server is ``dprelease-server`` in embedded mode (SQLite and objects under a temporary
``DPRELEASE_HOME``, jobs in-process) on a free port. A document's blocks run in order as one
bash script, so later blocks see the variables, functions and files of earlier ones: a
``bash`` block as it is, a ``python`` block as ``python - <<'EOF' … EOF`` (a fresh interpreter
that sees the exported variables). The placeholders the documents name are set: ``$API`` (the
server's URL) and ``$ADMIN_KEY`` (its admin key).

A block whose fence info string holds the word ``norun`` (```` ```bash norun ````) is shown, not
run: ``make run``, installs, data that is not in the repository. Every other block must be
``bash`` or ``python``, and the script reports each one it finished: the test checks that every
one of them ran."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.integration.servers import stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "docs/guide.md"]
RUNNABLE = {"bash", "python"}
FENCE = re.compile(r"^```(.*)$")
PY_END = "DPRELEASE_DOC_PYTHON_BLOCK_END"
RAN = "@@dprelease-doc-block-ran "

pytestmark = pytest.mark.timeout(240)


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string
    code: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runs(self) -> bool:
        return "norun" not in self.info.split()


def code_blocks(document: str) -> list[Block]:
    """The fenced blocks of ``document`` (fences at the start of a line)."""
    blocks: list[Block] = []
    lines = (ROOT / document).read_text().splitlines()
    start: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if fence is None:
            if start is not None:
                body.append(line)
            continue
        if start is None:
            start, body = (number, fence.group(1).strip()), []
        else:
            assert not fence.group(1).strip(), f"{document}:{number}: a fence inside a block"
            blocks.append(Block(document, start[0], start[1], "\n".join(body) + "\n"))
            start = None
    assert start is None, f"{document}:{start[0] if start else 0}: unclosed code block"
    return blocks


def script(blocks: list[Block]) -> str:
    """One bash script running the runnable ``blocks`` in order, reporting each it finished."""
    parts = ["set -euo pipefail", "set -a  # every variable a block sets reaches python blocks"]
    for index, block in enumerate(blocks):
        if not block.runs or block.language not in RUNNABLE:
            continue
        parts.append(f'echo "--- {block.document}:{block.line} ($SECONDS s)" >&2')
        if block.language == "bash":
            parts.append(block.code)
        else:
            assert PY_END not in block.code
            parts.append(f"python - <<'{PY_END}'\n{block.code}{PY_END}")
        parts.append(f"printf '\\n{RAN}{index}\\n'")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Server:
    url: str
    admin_key: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRELEASE_")}
    # The console scripts of this interpreter's environment (dprelease, dprelease-server) and
    # its python, importing this checkout's packages.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["DPRELEASE_HOME"] = str(home)
    server_env = {**env, "DPRELEASE_PORT": str(port), "DPRELEASE_LOG_LEVEL": "warning"}
    log = (home / "server.log").open("w")
    proc = subprocess.Popen(
        ["dprelease-server"], env=server_env, stdout=log, stderr=subprocess.STDOUT, cwd=home
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, time.monotonic() + 90, lambda: _read(home))
        admin_key = (home / "admin.key").read_text().strip()
        yield Server(url, admin_key, env)
    finally:
        stop(proc)
        log.close()


def _read(home: Path) -> str:
    return (home / "server.log").read_text()[-4000:]


def test_every_block_is_runnable_or_marked() -> None:
    for document in DOCUMENTS:
        for block in code_blocks(document):
            where = f"{document}:{block.line}"
            assert block.language, f"{where}: a code block without a language"
            if block.runs:
                assert block.language in RUNNABLE, (
                    f"{where}: ```{block.info} is neither bash nor python; mark it "
                    "```LANGUAGE norun if it must not run"
                )


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_blocks_run(document: str, server: Server, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        message = "curl is not installed: the documents' curl blocks cannot run"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    blocks = code_blocks(document)
    runnable = [i for i, b in enumerate(blocks) if b.runs and b.language in RUNNABLE]
    assert runnable, f"{document} has no block to run"
    env = {**server.env, "API": server.url, "ADMIN_KEY": server.admin_key}
    result = subprocess.run(
        ["bash", "-c", script(blocks)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    ran = [int(line[len(RAN) :]) for line in result.stdout.splitlines() if line.startswith(RAN)]
    if result.returncode != 0 or ran != runnable:
        failed = next((blocks[i] for i in runnable if i not in ran), None)
        where = f"{failed.document}:{failed.line}" if failed else "?"
        pytest.fail(
            f"{document}: the block at {where} failed (exit {result.returncode})\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
        )
