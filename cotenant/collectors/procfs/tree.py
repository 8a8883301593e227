"""Descendants of processes, from the parent pids of one procfs poll.

A serving engine runs its model in processes that send no spans: vLLM's ``llm_request`` span
comes from the API-server process, while its ``EngineCore`` child (and that one's
``Worker_N``) does the work and holds the GPU. :func:`descendants` finds them from the parent
pid of every process (field 4 of ``/proc/<pid>/stat``) so that
:meth:`collectors.gpu_resolve.GpuResolver.set_families` can lend them the model of the span's
process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> dict[int, int]:
    """descendant pid -> the root it descends from, for every root in ``roots`` that is in
    ``parents`` (pid -> parent pid, one poll's processes). A root below another root starts a
    family of its own (its descendants are its, not the upper root's); a root is never its own
    descendant. Linear in ``len(parents)``."""
    root_set = {r for r in roots if r in parents}
    if not root_set:
        return {}
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        if ppid != pid:
            children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    for root in root_set:
        stack = list(children.get(root, ()))
        while stack:
            pid = stack.pop()
            if pid in root_set or pid in out:  # another family; or a cycle (pid reuse races)
                continue
            out[pid] = root
            stack.extend(children.get(pid, ()))
    return out
