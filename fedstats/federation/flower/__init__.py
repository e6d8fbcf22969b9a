"""Run fedstats on Flower: the simulation engine (Ray) and real deployments (SuperLink, SuperNodes).

Needs the extra ``fedstats[flower]`` (tested with ``flwr[simulation]==1.41.0``).

Every model runs its rounds through :func:`fedstats.federation.run`, a server loop over a
*client side* that holds the clients' data and private states. This module provides a
client side made of Flower SuperNodes, so that no model is rewritten:

* :func:`make_client_app` builds the ``ClientApp``. Each SuperNode serves one client. The
  node keeps, in its own ``context.state``, everything that is the client's: the algorithm it
  was sent, its data (in a simulation; in a deployment it reads its own file), and its
  private state (EP site, mixture weights, optimiser moments), and it runs the very
  ``init_client`` / ``client_step`` that the in-process runner runs, with the same random
  streams (:func:`fedstats.federation.client_side.client_rng`). During a run only the reply
  arrays leave it; at the end its final private state goes to the server once (below).
* :class:`FlowerSession` is the server side. As a *simulation* it starts Flower's simulation
  engine in a background thread with one SuperNode per client (``fit(..., backend="flower")``
  does it for one call; keep a session open over many calls with ``with FlowerSession() as
  s: ... backend=s``). In a *deployment* it wraps the ``Grid`` of a ``ServerApp``'s
  ``@app.main()``: :meth:`FlowerSession.from_grid`, then :meth:`FlowerSession.remote_data`
  stands in for the data the server does not have.

The loop that decides what happens next (EP's damping back-off, EM to convergence, the
inner rounds of an online time step) is fedstats's own server loop, run where the fit runs:
inside ``@app.main()`` in a deployment. Flower only moves the messages, one type
(``train.fedstats``) whose config may carry:

* a start: the algorithm (pickled), the client's id, its position and the run's seed, and in
  a simulation its data (in a deployment the server's view of the data, no rows, which the
  node applies to its own file). The node calls ``init_client``. It rides on the client's
  first step of the run;
* a step: the round and the broadcast arrays (an ``ArrayRecord``). The node runs
  ``client_step``, checks its reply against the protocol and commits its new state only if
  the reply is valid; it answers with the reply arrays, or with ``skipped`` / ``failed``;
* a request for the node's private state: at the end of a run (so that the fit returns the
  same result object as in-process, the *final* state of each client goes to the server once,
  as with the in-process simulator's ``RunResult.client_states``), or for a checkpoint;
* ``drop``: forget the run (with the final state request).

Pickles: the server sends the algorithm and the client sends its state as pickles. Both
sides load them with a restricted unpickler that resolves only classes and registered client
functions defined in trusted packages (by their own module, no dotted names), numpy arrays
and a few builtins, so a peer cannot make the other side run arbitrary code through them.
Each node gets the algorithm as :meth:`~fedstats.federation.FederatedAlgorithm.for_client`
makes it for its client: no other client's entries (starting weights, previous states).
Not defended: a hostile *server* choosing the parameters of fedstats's own client steps
(nodes run what they are sent), and the content of the final states (see the README:
EP's and HM1's include the client's sufficient statistics X'X, X'y).

Failures: a client whose step raises is recorded as failed for that round, exactly as
in-process. A node that stops answering (no reply within ``timeout`` seconds, or the
SuperLink reports it unavailable) is *lost*: with ``on_disconnect="continue"`` it is recorded
as failed in that round and every later one and the run completes with the others
(``RunResult.lost``); with ``"raise"`` the run stops with :class:`ClientDisconnected` before
the server step of that round, so the server state is that of the last completed round.

Modules: :mod:`.wire` (message types, arrays and the restricted pickles), :mod:`.remote` (the
server's view of a deployment's data, a node's CSV), :mod:`.node` (the ``ClientApp``),
:mod:`.clients` (the server-side proxies of the nodes for one run) and :mod:`.session`
(:class:`FlowerSession`).
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("fedstats.federation.flower needs Flower: pip install 'fedstats[flower]'") from exc

from ..policy import NodePolicy, PolicyRefusal
from ..protocol import ClientDisconnected
from .node import make_client_app
from .remote import RemoteDataError, RemoteFederatedData, read_node_csv
from .session import FlowerSession
from .wire import dumps, loads

__all__ = [
    "FlowerSession",
    "ClientDisconnected",
    "NodePolicy",
    "PolicyRefusal",
    "RemoteFederatedData",
    "RemoteDataError",
    "make_client_app",
    "read_node_csv",
    "dumps",
    "loads",
]
