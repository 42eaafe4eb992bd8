"""A tiny key-value store over a shared directory, with the subset of torch.distributed's Store
interface symheap uses (set/get/wait/check/delete_key/timeout), and an mpi4py-like
communicator built on it. Lets the tests drive symheap's store and comm rendezvous without
torch or MPI."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any, List, Optional


class FileStore:
    """Keys are files in ``path``; values are bytes."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = path
        self._timeout = timeout
        os.makedirs(path, exist_ok=True)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key.replace("/", "%"))

    def set(self, key: str, value: Any) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        tmp = self._file(key) + f".tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))

    def check(self, keys: List[str]) -> bool:
        return all(os.path.exists(self._file(k)) for k in keys)

    def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
        limit = self._timeout if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"wait timeout after {limit:.3f} s for {keys}")
            time.sleep(0.001)

    def get(self, key: str) -> bytes:
        self.wait([key])
        with open(self._file(key), "rb") as f:
            return f.read()

    def delete_key(self, key: str) -> bool:
        try:
            os.remove(self._file(key))
            return True
        except FileNotFoundError:
            return False


class FileComm:
    """``allgather`` of picklable-free bytes over a FileStore (like mpi4py's COMM_WORLD)."""

    def __init__(self, store: FileStore, rank: int, size: int) -> None:
        self.store = store
        self._rank = rank
        self._size = size
        self._seq = 0

    def Get_rank(self) -> int:
        return self._rank

    def Get_size(self) -> int:
        return self._size

    def allgather(self, obj: bytes) -> List[bytes]:
        seq = self._seq
        self._seq += 1
        self.store.set(f"comm/{seq}/{self._rank}", obj)
        return [self.store.get(f"comm/{seq}/{r}") for r in range(self._size)]
