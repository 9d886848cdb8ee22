"""The ``papa`` console script (pyproject.toml ``[project.scripts]``): a module outside :mod:`papa_lib`.

Importing anything from :mod:`papa_lib` runs its ``__init__``, which loads torch and transformers and registers the
built-ins (seconds). ``papa --version`` needs none of that: it is answered here from the installed package's metadata,
as :data:`papa_lib.__version__` is. Every other command line goes to :func:`papa_lib.cli.main`.
"""

from __future__ import annotations

import sys

__all__ = ["main", "version"]


def version() -> str:
    """The installed ``papa_lib``'s version, ``'0+unknown'`` for a checkout that was never installed (as
    :data:`papa_lib.__version__`)."""
    from importlib import metadata

    try:
        return metadata.version("papa_lib")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def main(argv=None) -> int:
    """Run ``papa``: print the version for ``--version`` (``--debug`` aside), else :func:`papa_lib.cli.main`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if [arg for arg in args if arg != "--debug"] == ["--version"]:
        print(f"papa {version()}")
        return 0
    from papa_lib.cli import main as papa_main

    return papa_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
