"""Every SuperNode serves one client: the CSV at its node config ``data-path``.

    flower-supernode --insecure --superlink 127.0.0.1:8000 --port 9094 \\
        --node-config "data-path='data/site_a.csv' client='site_a'"

Node config keys:

``data-path`` (required)
    the node's CSV (a relative path is taken from the directory the SuperNode was started in).
``client``
    the client id; default: the value of the file's ``site`` column, or else the file name
    without extension.
``target``
    the response column, for a regression model (``target='y'`` with ``model='hm2'``); absent
    or empty for the Gaussian mixtures.
``features``
    the feature columns, comma-separated (``features='x1,x2'``); default: every column except
    ``site`` and the target.

A ``site`` column (as ``make_data.py`` writes) names the client a row belongs to: it is never
a feature. Every row of the file must carry the same site, and it must be the node's
``client`` when both are given. Every feature and the target must be numeric.
"""

from pathlib import Path

from fedstats import FederatedData
from fedstats.data import DataError
from fedstats.federation.flower import make_client_app

SITE = "site"


def read_site_csv(context) -> FederatedData:
    """This node's data: one client, the feature columns and (if configured) the target."""
    import pandas as pd

    cfg = context.node_config
    if "data-path" not in cfg:
        raise DataError("this SuperNode has no data: start it with --node-config \"data-path='site_a.csv'\"")
    path = Path(str(cfg["data-path"]))
    frame = pd.read_csv(path)
    client = str(cfg.get("client", "")).strip()
    if SITE in frame.columns:
        sites = frame[SITE].astype(str).unique()
        if len(sites) != 1:
            raise DataError(
                f"{path.name}: column {SITE!r} holds {len(sites)} sites ({list(sites[:5])}); "
                "give each SuperNode a file of its own site"
            )
        if client and client != sites[0]:
            raise DataError(f"{path.name}: this node is client {client!r} but its rows are site {sites[0]!r}")
        client = client or sites[0]
        frame = frame.drop(columns=SITE)
    client = client or path.stem
    target = str(cfg.get("target", "")).strip() or None
    if target is not None and target not in frame.columns:
        raise DataError(f"{path.name} has no target column {target!r} (columns: {list(frame.columns)})")
    chosen = str(cfg.get("features", "")).strip()
    if chosen:
        features = [f.strip() for f in chosen.split(",") if f.strip()]
    else:
        features = [c for c in frame.columns if c != target]
    return FederatedData.from_dataframe(
        frame.assign(__client__=client), by="__client__", target=target, features=features
    )


app = make_client_app(read_site_csv)
