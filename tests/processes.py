"""Process checks shared by the tests of worker processes (imported by those tests)."""


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone).

    >>> import os
    >>> alive(os.getpid())
    True
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
