"""The tables of docs/guides/pretrained.md that the interop tests compare
with the library's lists (`test_supported_lists.py`,
`test_refused_backbones.py`)."""

import pathlib

GUIDE = (
    pathlib.Path(__file__).resolve().parents[2] / "docs/guides/pretrained.md"
)


def guide_rows(section):
    """The rows of the table under the guide's heading `## {section}`
    whose first cell is code (the lines starting "| `"), each as its
    cells, stripped."""
    text = GUIDE.read_text("utf-8")
    part = text.split(f"## {section}", 1)[1].split("\n## ")[0]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in part.splitlines()
        if line.startswith("| `")
    ]
