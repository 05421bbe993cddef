"""The harness that the tests (``tests/``) and the benchmarks (``benchmarks/``) share.

As trio ships ``trio/testing``: real processes, clients, fakes and checkers
for exercising hastandby from outside.  Importing it starts nothing and needs
no pytest (the fixtures are ``tests/conftest.py``'s); it imports neither
``tests`` nor ``benchmarks``, and the product never imports it
(``tests/unit/test_layers.py``).  Every process it starts is stopped by PID.

| module | what |
|---|---|
| ``paths`` | the checkout, where results go (``results/``, ignored) and where the C clients are compiled (``build/cexamples/``) |
| ``provenance`` | what a figure depends on besides the commit: ``host_info`` (the host, the commit), ``uncommitted_changes`` |
| ``auth`` | the run's users (admin, peer, app) in a temporary users file; URLs, client environments, serve options |
| ``certs`` | a CA, server and client certificates made with openssl (``make_pki``; ``make_certificates`` for benchmarks) |
| ``processes`` | free ports, ``Service`` (a child process with CPU/RSS accounting, stopped by PID) |
| ``waiting`` | bounded polling: ``wait_for`` (fails saying what it waited for), ``wait_until`` (true or false) |
| ``nodes`` | ``NodeProcess``: one ``hastandby serve`` on loopback, ready once it answers PING; ``read_node_log`` (a node's JSON log) |
| ``status_poller`` | ``StatusPoller``: a node's STATUS polled by a thread, each change kept (roles as an operator sees them) |
| ``cluster``, ``etcd_ha`` | clusters of nodes: promoted by hand (``HaCluster``), or elected by etcd (``EtcdHa``) |
| ``netns_cluster``, ``netns_workload`` | etcd and nodes each in a namespace of a ``netns.Network`` (signals, restarts, promote), and the numbered clients in one, their history read back (the nemesis suite, the client-cut benchmark) |
| ``etcd`` | a real, throw-away etcd server or cluster (TLS, authentication, pause/kill/restart) |
| ``netns`` | network namespaces: a WAN pair, a LAN on a bridge with link cuts and partitions (``Lan``; ``Network`` for the nemesis) |
| ``delay_proxy`` | a TCP proxy delaying each direction (a WAN on loopback); ``python -m hastandby.testing.delay_proxy`` |
| ``blackhole`` | an address whose connects hang, on loopback |
| ``clients`` | small blocking python-qpid-proton clients; a PLAIN ``SaslClient`` for raw connections |
| ``numbered_client`` | the numbered failover producer and consumer; ``python -m hastandby.testing.numbered_client`` |
| ``flood_clients`` | a producer and a flood of failed logins, each a process (``python -m hastandby.testing.flood_clients``) |
| ``cexamples`` | the proton C example clients and broker, patched and compiled on demand |
| ``checker`` | Jepsen's total-queue checker and the replica comparison: pure functions over histories |
| ``prometheus`` | a real, throw-away Prometheus server scraping test nodes |
| ``fake_coordinator``, ``fake_elected_node`` | etcd in memory and a HA node without a broker, for driving the election loop by hand |
"""
