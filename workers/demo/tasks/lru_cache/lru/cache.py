"""A least-recently-used cache on a dict plus a doubly linked list (O(1) get and put)."""

from typing import Any


class _Node:
    __slots__ = ("key", "value", "prev", "next")

    def __init__(self, key: Any, value: Any) -> None:
        self.key = key
        self.value = value
        self.prev: _Node | None = None
        self.next: _Node | None = None


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used key. get() and put() count as a
    use; `in` and keys() do not."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._nodes: dict[Any, _Node] = {}
        self._head: _Node | None = None  # most recently used
        self._tail: _Node | None = None  # least recently used
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: Any) -> bool:
        return key in self._nodes

    def get(self, key: Any, default: Any = None) -> Any:
        node = self._nodes.get(key)
        if node is None:
            self.misses += 1
            return default
        self.hits += 1
        self._unlink(node)
        self._push_front(node)
        return node.value

    def put(self, key: Any, value: Any) -> None:
        node = self._nodes.get(key)
        if node is not None:
            node.value = value
            self._unlink(node)
            self._push_front(node)
            return
        node = _Node(key, value)
        self._nodes[key] = node
        self._push_front(node)
        if len(self._nodes) > self.capacity:
            oldest = self._tail
            assert oldest is not None
            self._unlink(oldest)
            del self._nodes[oldest.key]

    def keys(self) -> list[Any]:
        """Keys from most to least recently used."""
        out = []
        node = self._head
        while node is not None:
            out.append(node.key)
            node = node.next
        return out

    def _push_front(self, node: _Node) -> None:
        node.prev = None
        node.next = self._head
        if self._head is not None:
            self._head.prev = node
        self._head = node
        if self._tail is None:
            self._tail = node

    def _unlink(self, node: _Node) -> None:
        if node.prev is not None:
            node.prev.next = node.next
        else:
            self._head = node.next
        if node.next is not None:
            node.next.prev = node.prev
        node.prev = node.next = None
