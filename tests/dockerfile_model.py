"""The Dockerfile and its build context as the image build sees them, for tests that cannot
run ``docker build`` (no daemon, no base images to pull here).

* ``parse(text)``: the Dockerfile's stages, each a list of ``Instruction`` (line continuations
  joined, comments and parser directives dropped, JSON-form arguments decoded).
* ``context_files(root)``: the files ``docker build`` sends, by ``.dockerignore``'s rules as
  moby's pattern matcher applies them: patterns are paths relative to the context root with
  ``*``, ``?`` and ``**``, a pattern also matches everything under a directory it matches, ``!``
  re-includes, and the last matching line wins.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case: FROM, RUN, COPY, …
    args: str  # the rest of the line, continuations joined with a space
    line: int  # 1-based line of the instruction's start

    def words(self) -> list[str]:
        """The arguments as a list: JSON form decoded, shell form split like a shell."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                pass
            else:
                return [str(v) for v in value]
        return shlex.split(text)

    def flags(self) -> dict[str, str]:
        """Leading ``--name=value`` options (COPY --from=…, RUN --mount=…)."""
        out: dict[str, str] = {}
        for w in self.words():
            if not w.startswith("--"):
                break
            name, _, value = w[2:].partition("=")
            out[name] = value
        return out


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def base_of(self, stage: Stage) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args[m[1] or m[2]], stage.base)


def parse(text: str) -> Dockerfile:
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        logical.append((start, buf + line))
        buf = ""
    if buf:
        logical.append((start, buf))
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for n, text_ in logical:
        cmd, _, rest = text_.partition(" ")
        ins = Instruction(cmd.upper(), rest.strip(), n)
        if ins.cmd == "FROM":
            w = [x for x in ins.words() if not x.startswith("--")]
            name = w[2] if len(w) >= 3 and w[1].lower() == "as" else None
            stages.append(Stage(w[0], name))
        elif not stages:
            if ins.cmd == "ARG":
                k, _, v = ins.args.partition("=")
                args[k.strip()] = v.strip()
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(args, stages)


def _pattern(p: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif p.startswith("**", i):
            out.append(".*")
            i += 2
        elif p[i] == "*":
            out.append("[^/]*")
            i += 1
        elif p[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(p[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _rules(root: Path) -> list[tuple[bool, re.Pattern[str], str]]:
    path = root / ".dockerignore"
    rules = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pat = line[1:].strip() if keep else line
        pat = pat.strip("/").removeprefix("./")
        rules.append((keep, _pattern(pat), pat))
    return rules


def _excluded(rel: str, rules: list[tuple[bool, re.Pattern[str], str]]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for keep, pat, _ in rules:
        if any(pat.match(p) for p in prefixes):
            out = not keep
    return out


def context_files(root: Path) -> list[str]:
    """Paths (relative, POSIX) of every file the build context holds."""
    rules = _rules(root)
    out = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        base = "" if here == "." else here + "/"
        # an excluded folder is not walked unless a ! line may take something back inside it
        dirs[:] = [
            d
            for d in dirs
            if not _excluded(base + d, rules)
            or any(k and (src.startswith(base + d + "/") or "*" in src) for k, _, src in rules)
        ]
        out += [base + f for f in files if not _excluded(base + f, rules)]
    return sorted(out)
