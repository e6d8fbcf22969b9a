"""A node runs only the apps its operator approved: ``fedstats-supernode``.

A Flower SuperNode runs the ClientApp of whatever app the run's submitter sends it (a FAB:
the app's code, zipped). A node that serves fedstats must run fedstats's ClientApp and nothing
else, or the submitter's own code could read the node's data file. Flower's own check
(``--trusted-entities``) accepts only apps signed by the Flower Hub; a local federation needs
a check the node enforces itself.

``fedstats-supernode`` starts ``flower-supernode`` (every argument passed on) so that each
ClientApp process it launches first computes the SHA-256 of the app it received and refuses
it, before unpacking or importing anything from it, unless the hash is on the node's list of
approved apps:

    fedstats-supernode --approve examples/flower_app --approved-apps approved.txt -- \\
        --superlink 127.0.0.1:9092 --root-certificates certs/ca.crt \\
        --auth-supernode-private-key certs/site_a --node-config "data-path='site_a.csv'"

``--approve PATH`` adds an app (a directory, built as ``flwr run`` builds it; a ``.fab`` file;
or a hash) to the list file; ``--approved-apps FILE`` names the list (one hash per line,
optionally followed by a note). How: Flower's SuperNode launches its ClientApp processes as
the command ``flwr-clientapp``, found on ``PATH``; ``fedstats-supernode`` puts first on the
node's ``PATH`` a private folder whose ``flwr-clientapp`` is :func:`clientapp_main`, which
checks the app and then runs Flower's own ``flwr-clientapp``. A refused app never reaches the
ClientApp: the server receives Flower's error for the message, and the node logs the hash.

``--insecure`` (no TLS, no node authentication) is refused unless ``--rehearsal`` is given: a
labelled local rehearsal only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: the environment variable that names the node's list of approved apps
APPROVED_APPS = "FEDSTATS_APPROVED_APPS"
_HASH = re.compile(r"^[0-9a-f]{64}$")


class AppNotApproved(PermissionError):
    """An app whose hash is not on the node's list of approved apps."""


def app_hash(source: str | os.PathLike) -> str:
    """The SHA-256 (hex) of an app as a SuperNode receives it: of a FAB file, of the FAB that
    ``flwr run`` builds from an app directory, or a hash given as it is."""
    text = os.fspath(source)
    if _HASH.match(text.lower()) and not os.path.exists(text):
        return text.lower()
    path = Path(text)
    if path.is_dir():
        from flwr.cli.build import build_fab_from_disk

        return hashlib.sha256(build_fab_from_disk(path)).hexdigest()
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    raise FileNotFoundError(f"{text}: neither an app directory, a .fab file nor a SHA-256 hash")


def approved_hashes(path: str | os.PathLike) -> set[str]:
    """The hashes on the list at ``path`` (one per line, a note after it; ``#`` comments)."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            h = line.split()[0].lower()
            if not _HASH.match(h):
                raise ValueError(f"{path}, line {n}: {h!r} is not a SHA-256 hash")
            out.add(h)
    return out


def check_app(content: bytes, listing: str | os.PathLike | None = None) -> str:
    """The hash of the app ``content`` if the node approved it; :class:`AppNotApproved`
    otherwise (also when the node has no list: it approves nothing)."""
    h = hashlib.sha256(content).hexdigest()
    listing = listing if listing is not None else os.environ.get(APPROVED_APPS)
    if not listing:
        raise AppNotApproved(f"app {h} refused: this node has no list of approved apps (${APPROVED_APPS})")
    if h not in approved_hashes(listing):
        raise AppNotApproved(f"app {h} refused: not on this node's list of approved apps ({listing})")
    return h


def clientapp_main() -> None:
    """``flwr-clientapp`` with the app checked first (see the module docs)."""
    import flwr.supernode.runtime.run_clientapp as runtime

    install = runtime.install_from_fab

    def checked_install(content: bytes, *args, **kwargs):
        h = check_app(content)  # raises before anything of the app is unpacked or imported
        print(f"fedstats: approved app {h}", file=sys.stderr, flush=True)
        return install(content, *args, **kwargs)

    setattr(runtime, "install_from_fab", checked_install)  # the name run_clientapp calls
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    flwr_clientapp()


def _shim(folder: Path) -> None:
    """Write ``folder/flwr-clientapp``: this Python running :func:`clientapp_main`."""
    exe = folder / "flwr-clientapp"
    exe.write_text(
        f"#!{sys.executable}\nfrom fedstats.federation.flower.approved import clientapp_main\nclientapp_main()\n",
        encoding="utf-8",
    )
    exe.chmod(stat.S_IRWXU)


def supernode_main(argv: Sequence[str] | None = None) -> None:
    """The ``fedstats-supernode`` command (see the module docs)."""
    parser = argparse.ArgumentParser(
        prog="fedstats-supernode",
        description="Start flower-supernode so that it runs only apps on this node's list of approved apps. "
        "Arguments after -- go to flower-supernode.",
    )
    parser.add_argument("--approved-apps", required=True, help="the list of approved app hashes (a text file)")
    parser.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="APP",
        help="add an app (a directory, a .fab file or a SHA-256) to the list first",
    )
    parser.add_argument(
        "--rehearsal", action="store_true", help="allow --insecure (no TLS, no node authentication): a local rehearsal"
    )
    parser.add_argument("--print-only", action="store_true", help="write the list and print the hashes; start nothing")
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    listing = Path(args.approved_apps).resolve()
    if args.approve:
        known = approved_hashes(listing) if listing.exists() else set()
        with open(listing, "a", encoding="utf-8") as f:
            for app in args.approve:
                h = app_hash(app)
                print(f"fedstats-supernode: approved {h} ({app})", flush=True)
                if h not in known:
                    f.write(f"{h} {Path(app).name}\n")
                    known.add(h)
    if args.print_only:
        return
    if not listing.exists() or not approved_hashes(listing):
        parser.error(f"{listing} approves no app: add one with --approve")
    if "--insecure" in rest and not args.rehearsal:
        parser.error("--insecure (no TLS, no node authentication) is for a labelled rehearsal only: add --rehearsal")
    real = shutil.which("flower-supernode")
    if real is None:
        parser.error("flower-supernode is not installed (pip install 'fedstats[flower]')")
    folder = Path(tempfile.mkdtemp(prefix="fedstats-node-"))  # private (0700): nobody else can swap the shim
    try:
        _shim(folder)
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(folder), env.get("PATH", "")])
        env[APPROVED_APPS] = str(listing)
        node = subprocess.Popen([real, *rest], env=env)
        for sig in (signal.SIGINT, signal.SIGTERM):  # the node stops as if signalled itself
            signal.signal(sig, lambda s, _frame: node.send_signal(s))
        code = node.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sys.exit(code)
