"""Rewrite the key table in docs/configuration.md from cotenant.app.config (after adding keys)."""

from pathlib import Path

from cotenant.app.config import keys_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def main() -> None:
    text = DOC.read_text()
    start = text.index("| key | environment | default | meaning |")
    end = start
    lines = text[start:].splitlines(keepends=True)
    for line in lines:
        if not line.startswith("|"):
            break
        end += len(line)
    DOC.write_text(text[:start] + keys_markdown() + text[end:])


if __name__ == "__main__":
    main()
