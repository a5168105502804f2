"""Reports read offline: no script, stylesheet or image the HTML fetches from the network."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from specbook.run.runner import render_html

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = re.compile(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"', re.IGNORECASE)
# what a script fetches at run time (nbconvert's mermaid loader: `await import("https://cdnjs...")`)
FETCHED_BY_SCRIPT = re.compile(r"(?:import|fetch)\(\s*[\"'`](?:https?:)?//")


def test_render_html_writes_a_report_that_fetches_nothing(tmp_path):
    nb = tmp_path / "report.ipynb"
    shutil.copy(ROOT / "tests" / "fixtures" / "notebooks" / "good.ipynb", nb)
    html = render_html(nb, "offline").read_text()
    assert "<body" in html and EXTERNAL.findall(html) == [] and FETCHED_BY_SCRIPT.findall(html) == []


@pytest.mark.parametrize("report", sorted((ROOT / "docs" / "reports").glob("*/report.html")), ids=lambda p: p.parent.name)
def test_committed_reports_fetch_nothing(report):
    html = report.read_text()
    assert EXTERNAL.findall(html) == [] and FETCHED_BY_SCRIPT.findall(html) == []


def test_render_html_gives_every_report_its_table_of_contents(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A report\n\n## First part\n\ntext"),
                                         nbformat.v4.new_markdown_cell("## Second part\n\n### In it")])
    path = tmp_path / "report.ipynb"
    nbformat.write(nb, path)
    html = render_html(path, "toc").read_text()
    assert "Contents: 3 sections" in html and html.index("</h1>") < html.index("<nav class='sb-toc'>")
    assert "<a href='#First-part'>First part</a>" in html and "<a href='#In-it'>In it</a>" in html
