"""Every SuperNode serves one client: the CSV at its node config ``data-path``.

    flower-supernode --insecure --superlink 127.0.0.1:8000 --port 9094 \\
        --node-config "data-path='site_a.csv' client='site_a'"

``client`` defaults to the file name; add ``target='y'`` for a regression model.
"""

from fedstats.federation.flower import make_client_app, read_node_csv

app = make_client_app(read_node_csv)
