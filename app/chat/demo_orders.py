"""The demo tenant's order system, served by this app so the support chat's actions have a real
HTTP endpoint to call (configs/actions/northwind.yaml). Seeded from configs/demo_orders.yaml;
changes live in this process's memory.

    GET  /demo/orders/<order_id>             -> the order: status, detail, eta, items, address, history
    POST /demo/orders/<order_id>/address     {"address"} -> changed (409 once it has shipped)
    POST /demo/orders/<order_id>/returns     {"items"} -> a return and its label (409 unless delivered)

A POST with an Idempotency-Key header that was seen before gets the first answer again and
changes nothing. With DEMO_ORDERS_KEY set, every call needs it in X-Api-Key (401 otherwise).
"""
from __future__ import annotations

import copy
import hmac
import os
import threading

from flask import Blueprint, current_app, jsonify, request

from configs import read_yaml

bp = Blueprint("demo_orders", __name__, url_prefix="/demo/orders")
_NOT_SHIPPED = ("processing",)


class OrderBook:
    def __init__(self, path=None):
        _, data = read_yaml("demo orders", "demo_orders.yaml", path, "DEMO_ORDERS_PATH")
        self.orders = {k: {**v, "order_id": k, "history": []} for k, v in (data.get("orders") or {}).items()}
        self.lock = threading.Lock()
        self.answered: dict[str, tuple[int, dict]] = {}      # idempotency key -> the first answer
        self.returns = 0

    def view(self, order_id: str) -> dict | None:
        with self.lock:
            order = self.orders.get(order_id)
            return copy.deepcopy(order) if order is not None else None

    def once(self, key: str | None, change) -> tuple[int, dict]:
        """The change made once per idempotency key; a repeated key gets the first answer."""
        with self.lock:
            if key and key in self.answered:
                return self.answered[key]
            answer = change()
            if key:
                self.answered[key] = answer
            return answer

    def change_address(self, order_id: str, address: str) -> tuple[int, dict]:
        order = self.orders.get(order_id)
        if order is None:
            return 404, {"error": f"no order {order_id}"}
        if order["status"] not in _NOT_SHIPPED:
            return 409, {"error": f"The order is {order['status']}."}
        order["address"] = address
        order["history"].append({"change": "address", "address": address})
        return 200, {"order_id": order_id, "address": address, "status": order["status"]}

    def start_return(self, order_id: str, items: list[str]) -> tuple[int, dict]:
        order = self.orders.get(order_id)
        if order is None:
            return 404, {"error": f"no order {order_id}"}
        if order["status"] != "delivered":
            return 409, {"error": f"Order {order_id} is {order['status']}; a return can start once it is delivered."}
        self.returns += 1
        return_id = f"R-{order_id[3:]}-{self.returns}"
        order["history"].append({"change": "return", "return_id": return_id, "items": items})
        return 201, {"order_id": order_id, "return_id": return_id, "items": items,
                     "instructions": "A prepaid return label is on its way to your email; please send the items "
                                     "back within 30 days."}


def _book() -> OrderBook:
    return current_app.extensions["demo_orders"]


@bp.before_request
def _key():
    expected = os.environ.get("DEMO_ORDERS_KEY")
    if expected and not hmac.compare_digest(request.headers.get("X-Api-Key", "").encode(), expected.encode()):
        return jsonify({"error": "missing or wrong X-Api-Key"}), 401
    return None


def _body_field(name: str, kind: type):
    body = request.get_json(silent=True)
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, kind) and value else None


@bp.get("/<order_id>")
def get_order(order_id: str):
    order = _book().view(order_id)
    if order is None:
        return jsonify({"error": f"no order {order_id}"}), 404
    return jsonify(order)


@bp.post("/<order_id>/address")
def change_address(order_id: str):
    address = _body_field("address", str)
    if address is None:
        return jsonify({"error": "address: a non-empty string is required"}), 400
    status, body = _book().once(request.headers.get("Idempotency-Key"),
                                lambda: _book().change_address(order_id, address.strip()))
    return jsonify(body), status


@bp.post("/<order_id>/returns")
def start_return(order_id: str):
    items = _body_field("items", list)
    if items is None or not all(isinstance(i, str) and i.strip() for i in items):
        return jsonify({"error": "items: a non-empty list of item names is required"}), 400
    status, body = _book().once(request.headers.get("Idempotency-Key"),
                                lambda: _book().start_return(order_id, [i.strip() for i in items]))
    return jsonify(body), status


def init_demo_orders(app) -> None:
    app.extensions["demo_orders"] = OrderBook(app.config.get("DEMO_ORDERS_PATH"))
    app.register_blueprint(bp)
