"""Help text keeps its square brackets: rich markup must not eat `[spark]` or
`[[hosts]]` (issue 32, item 9)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hpvc.cli import tree


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["spark", "--help"], "(spec [spark], docs/spark.md)"),
        (["plan", "--help"], "([[hosts]] name, topology"),
        (["--help"], "(spec [spark], docs/spark.md)"),
    ],
)
def test_help_shows_bracketed_words(argv: list[str], want: str) -> None:
    result = CliRunner().invoke(tree.app, argv, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert want in " ".join(result.output.split())
