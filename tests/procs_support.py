"""What the tests use to check that a run left no process behind: the living descendants of a process."""

from __future__ import annotations

import psutil


def living_descendants(pid: int) -> list[psutil.Process]:
    """Non-zombie descendants of `pid`, found through parent links; [] when `pid` is gone.

    Orphans re-parented to init (or a subreaper) are no longer descendants: take this snapshot
    before stopping a group when you want to check afterwards that everything died.
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    living = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                living.append(child)
        except psutil.NoSuchProcess:
            continue  # exited while we looked
    return living
