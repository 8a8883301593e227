from pathlib import Path

from cotenant.app.config import keys_markdown

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_configuration_doc_lists_every_key_as_generated() -> None:
    assert keys_markdown() in (DOCS / "configuration.md").read_text()
