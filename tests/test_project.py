"""The project's own files: the committed GPT-2 files are the Hub's, and CI runs the README's test command."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The Hub's openai-community/gpt2 files (sha256 as listed by the Hub and by ../shared/gpt2/SHA256SUMS).
HUB_SHA256 = {
    "config.json": "0daed7749b4f02b8f76240d5444551d7b08712dab4d0adb8239c56ba823bb7b4",
    "tokenizer.json": "8414cab924d8b9b33013f0d221c5862f365ee9be39c5c2bfae8a5a9e970478a6",
}


@pytest.mark.parametrize("name", sorted(HUB_SHA256))
def test_gpt2_files_are_the_hubs(name):
    digest = hashlib.sha256((ROOT / "gpt2" / name).read_bytes()).hexdigest()
    assert digest == HUB_SHA256[name], f"gpt2/{name} differs from the Hub's file"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\s*```(?:sh|bash|console)?\n(.+?)\n```", readme, re.S)
    assert match, "README.md has no test command block (marked <!-- test-command -->)"
    command = match.group(1).strip().splitlines()[-1].strip()
    assert command in (ROOT / ".ci" / "run").read_text(), f".ci/run does not run the README's {command!r}"
