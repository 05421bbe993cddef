"""The broker takes one typed hooks object (broker/hooks.py ``NodeHooks``): nothing outside it assigns its attributes.

The layers above (HA, DR, the CLI, metrics) decide what the broker asks them through ``Node.use_hooks`` (once),
claim links through ``BrokerHandler.claim_links`` and register observers through the node's lists; none of
them sets an attribute of the node or of its handler.  Read from the source, as test_layers.py reads imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

from proton import Connection

from hastandby.broker.hooks import NodeHooks, StandaloneHooks
from hastandby.ha.admission import ClientAdmission

PACKAGE = Path(__file__).resolve().parents[2] / "hastandby"
INSIDE = ("broker/", "node.py")  # the broker and its node may set their own attributes


def _declared(path: Path, classes: set[str]) -> set[str]:
    """Every attribute, method and property of ``classes`` in ``path``: ``self.x = ...`` and ``def x``."""
    names: set[str] = set()
    for cls in ast.walk(ast.parse(path.read_text())):
        if isinstance(cls, ast.ClassDef) and cls.name in classes:
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef):
                    names.add(node.name)
                elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                      and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    names.add(node.attr)
    return names


# The broker node's and its handler's attributes: what ``node.x = ...`` must not set from outside.
BROKER = _declared(PACKAGE / "node.py", {"Node"}) | _declared(PACKAGE / "broker" / "server.py", {"BrokerHandler"})


def _chain(node: ast.expr) -> list[str]:
    """``self.node.handler`` -> ["self", "node", "handler"]; [] if it is not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    return [node.id, *reversed(parts)]


def _targets(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        targets = [statement.target]
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        else:
            flat.append(target)
    return flat


def _sets_a_broker_attribute(chain: list[str]) -> bool:
    """Any attribute of ``<anything>.handler`` or ``self.node``; of ``node`` or ``<anything>.node``, one the broker's
    node or handler has (a test cluster's process handle, also called ``node``, is not the broker's)."""
    if len(chain) < 2:
        return False
    owner, attr = chain[-2], chain[-1]
    return owner == "handler" or (chain[:2] == ["self", "node"] and len(chain) > 2) or (owner == "node" and attr in BROKER)


MUTATORS = {"append", "extend", "insert", "remove", "clear", "update", "add", "discard", "pop", "setdefault"}


def assignments(source: str) -> list[str]:
    """Where ``source`` sets an attribute of the broker's node or handler, or changes a collection the handler
    holds in place (``node.handler.attach_hooks.append(...)`` was one: links are claimed with ``claim_links``)."""
    found = []
    for statement in ast.walk(ast.parse(source)):
        if isinstance(statement, ast.Call) and isinstance(statement.func, ast.Attribute) \
                and statement.func.attr in MUTATORS:
            held = _chain(statement.func.value)
            if len(held) >= 2 and held[-2] == "handler":
                found.append(f"{statement.lineno}: {'.'.join(held)}.{statement.func.attr}()")
        if isinstance(statement, ast.stmt):
            for target in _targets(statement):
                chain = _chain(target)
                if _sets_a_broker_attribute(chain):
                    found.append(f"{statement.lineno}: {'.'.join(chain)}")
    return sorted(found, key=lambda where: int(where.split(":")[0]))


def test_nothing_outside_the_broker_assigns_an_attribute_of_the_node_or_its_handler() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if "__pycache__" in path.parts or relative.startswith(INSIDE):
            continue
        found += [f"{relative}:{where}" for where in assignments(path.read_text())]
    assert found == []


def test_the_scan_finds_what_it_looks_for() -> None:
    assert {"state", "handler", "hooks", "shutdown_refusal", "admission", "fenced_refusal"} & BROKER >= {
        "handler", "hooks"}
    source = """
node.state = "primary"
node.handler.admission = admit
self.node.handler.fenced_refusal = refuse
self.node.anything = 1
ha.node.handler.hooks, other = hooks, 2
node.hooks += 1
node.down = True  # a test cluster's process handle, not the broker's node
self.node_count = 3
node.handler.attach_hooks.append(claim)
node.handler.claim_links(claim)
node.on_start.append(start)  # the node's observers: registered, not assigned
"""
    assert assignments(source) == ["2: node.state", "3: node.handler.admission", "4: self.node.handler.fenced_refusal",
                                   "5: self.node.anything", "6: ha.node.handler.hooks", "7: node.hooks",
                                   "10: node.handler.attach_hooks.append()"]


def test_a_standalone_node_admits_everyone_and_says_so() -> None:
    hooks: NodeHooks = StandaloneHooks()
    connection = Connection()
    assert hooks.state == "standalone"
    assert hooks.admit(connection) is None and hooks.open_properties(connection) is None
    assert hooks.fenced_refusal().condition.name == "amqp:connection:forced" and not hooks.fenced_refusal().abort
    assert hooks.shutdown_refusal().condition.description == "node shutting down"
    assert not hooks.shutdown_refusal().abort


def test_a_cluster_nodes_hooks_are_its_admission() -> None:
    """``ClientAdmission`` is what ``HaNode`` gives the node (mypy checks it is a ``NodeHooks``)."""
    for name in ("state", "admit", "open_properties", "fenced_refusal", "shutdown_refusal"):
        assert hasattr(ClientAdmission, name), name
