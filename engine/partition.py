"""A collection served by its partitions: each partition keeps its own vectors; the collection-wide view runs the
engine.

The query engine reads a store's vectors in a few places only: the search, each candidate row's dot product with
its query, and the query-independent tables made from the vectors (neighbour dots, block statistics, each row's and
each passage's dot with its heading path) and the passages' cosine scan. Everything else a query reads (the rows'
positions, paragraphs, sections, tokens, heading paths, the BM25 statistics of the whole collection, the
passages' rows) is small per row and kept once, collection-wide, by the coordinator (the process that runs the
engine). So a collection is served as:

- `PartitionServer`: one partition store opened on its own (its vectors mapped, its index loaded), answering in
  its local row ids: `search` (its top k by cosine), `dots` (entries' query . row), `neighbour_dots`,
  `block_stats`, `row_path_dots` / `passage_path_dots` (with the collection's heading vectors), `passage_topk`.
  Pure functions of the partition and their arguments: a call retried on a restarted actor gives the same answer.
- `PartitionedVectors`: the coordinator's view of the vectors of all partitions, in global row ids. A search fans
  out to every partition and merges by (score descending, global row ascending), which is the global top k of an
  exact search (equal scores, lower row first, as `exact_topk`); a dot product is computed by the partition that
  holds the row with the same operations as one store (`kernels.gather.entry_dots`), so it has the same bits.
  The tables are each partition's, scattered into global rows (a row's neighbours and blocks never leave its
  document, so never its partition).

Clients: `LocalClient` (a server in this process: the partitions opened in turn) or jobs.query_partitions'
Ray actor client; both are called as `client.submit(method, *args)` -> a pending result, `client.gather(pending)`
-> the values, so the fan-out runs on all partitions at once where they are actors. Arguments and results are
numpy arrays. docs/collections.md, "Serving partitions".
"""

from __future__ import annotations

import numpy as np
import torch

from qasc.engine.errors import QascError, first_line
from qasc.engine.fill import passage_path_dots, passage_top_cosine
from qasc.engine.store.index import sort_top
from qasc.engine.tables import StoreTables, row_path_dots
from qasc.kernels.gather import entry_dots

# entries per dot-product call to a partition: its arguments and result (int32 query and row of each entry, float32
# value: 12 MB) stay small in the serving process whatever the batch (a 1,024-query block of the heading context
# scores ~4M entries)
DOTS_BLOCK_ENTRIES = 1 << 20


class PartitionServer:
    """One partition store's vector operations, in its local row / heading path / passage ids (module docstring):
    `PartitionServer(path)`."""

    def __init__(self, path: str, device: str = "cpu") -> None:
        from qasc.engine.store.reader import Store

        try:
            self.store = Store.open(path, device=device)
        except QascError as exc:
            raise QascError(f"partition {path} cannot be opened: {first_line(exc)}") from None
        self.tables = StoreTables(self.store, torch.device(device))

    @property
    def vectors(self) -> torch.Tensor:
        return self.tables.embeddings

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query (Q, dim) float32, k -> scores (Q, k) float32 (-inf where missing), local rows (Q, k) int64 (-1)."""
        scores, rows = self.store.search_tensor(torch.from_numpy(query), k)
        return scores.cpu().numpy(), rows.cpu().numpy()

    def dots(self, query: np.ndarray, who: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """query (Q, dim) float32, who (E,) int32 | int64 each entry's query, rows (E,) int32 | int64 local rows ->
        (E,) float32."""
        return entry_dots(self.vectors, torch.from_numpy(query), torch.from_numpy(who),
                          torch.from_numpy(rows)).cpu().numpy()

    def neighbour_dots(self, width: int) -> np.ndarray:
        """(N_p, >= width) float32: StoreTables.neighbour_dots of this partition."""
        return self.tables.neighbour_dots(width).cpu().numpy()

    def block_stats(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """kind paragraph | section -> sizes (N_p,) int32, norms (N_p,) float32: StoreTables.block_stats."""
        sizes, norms = self.tables.block_stats(kind)
        return sizes.cpu().numpy(), norms.cpu().numpy()

    def row_path_dots(self, path_emb: np.ndarray) -> np.ndarray:
        """path_emb (H_p, dim) float32 the collection's vectors of this partition's heading paths -> (N_p,)
        float32 each row's dot with its path's vector (engine.tables.row_path_dots)."""
        row_heading = torch.as_tensor(np.asarray(self.store.row_heading, np.int64))
        if not len(path_emb):  # a partition without heading paths (the collection has some)
            return np.zeros(len(row_heading), np.float32)
        return row_path_dots(self.vectors, torch.from_numpy(path_emb), row_heading).cpu().numpy()

    def passage_path_dots(self, path_emb: np.ndarray) -> np.ndarray:
        """path_emb (H_p, dim) float32 as `row_path_dots` -> (P_p,) float32 each passage's dot with the vector of
        its first row's path (engine.fill.passage_path_dots)."""
        passages = self.store.passages
        path = torch.as_tensor(np.asarray(self.store.row_heading, np.int64)[passages.first])
        return passage_path_dots(torch.as_tensor(np.asarray(passages.emb)), path,
                                 torch.from_numpy(path_emb)).cpu().numpy()

    def passage_topk(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """query (Q, dim) float32, k -> cos (Q, k) float32 (-inf where missing), local passage ids (Q, k) (-1):
        engine.fill.passage_top_cosine."""
        emb = torch.as_tensor(np.asarray(self.store.passages.emb))
        cos, ids = passage_top_cosine(emb, torch.from_numpy(query), k)
        return cos.cpu().numpy(), ids.cpu().numpy()

    def peak_rss(self) -> int:
        """This process's peak resident memory in bytes (VmHWM; 0 where /proc is not there)."""
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0


class LocalClient:
    """A partition served in this process: `submit` runs the call at once and `gather` returns the values."""

    def __init__(self, server: PartitionServer) -> None:
        self.server = server

    def submit(self, method: str, *args):
        return getattr(self.server, method)(*args)

    @staticmethod
    def gather(pending: list) -> list:
        return list(pending)


def to_global(ids: np.ndarray, global_ids: np.ndarray) -> np.ndarray:
    """ids (Q, k) int64 a partition's local ids (-1: missing), global_ids (n_p,) its local id -> global id ->
    (Q, k) int64 global ids (-1 kept)."""
    return np.where(ids >= 0, global_ids[np.maximum(ids, 0)], -1)


def merge_top(scores: list[np.ndarray], ids: list[np.ndarray], k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per partition scores (Q, k_p) float32 and global ids (Q, k_p) int64 (-1 missing) -> the k best (Q, k) of
    all, by score descending, equal scores lower id first (-inf / -1 where fewer): the global top k when each
    partition's list is its exact top k."""
    s, i = sort_top(torch.as_tensor(np.concatenate(scores, axis=1), device=device),
                    torch.as_tensor(np.concatenate(ids, axis=1), device=device))
    s, i = s[:, :k], i[:, :k]
    if s.shape[1] < k:
        pad = k - s.shape[1]
        s = torch.cat([s, s.new_full((s.shape[0], pad), float("-inf"))], dim=1)
        i = torch.cat([i, i.new_full((i.shape[0], pad), -1)], dim=1)
    return s, i


class PartitionedVectors:
    """The vectors of a collection's partitions, in global ids (module docstring): `PartitionedVectors(layout,
    clients, device)`. layout: engine.store.collection_reader.CollectionLayout; clients: one per partition, None
    for a partition without documents; device: where the merged results and gathered values go."""

    def __init__(self, layout, clients: list, device: torch.device) -> None:
        self.layout = layout
        self.clients = clients
        self.device = torch.device(device)
        self.n_total = int(sum(len(r) for r in layout.part_rows))
        row_part = np.zeros(self.n_total, np.int32)
        row_local = np.zeros(self.n_total, np.int64)
        for p, rows in enumerate(layout.part_rows):
            row_part[rows] = p
            row_local[rows] = np.arange(len(rows))
        self.row_part = torch.as_tensor(row_part, device=self.device)  # (N,) each global row's partition
        self.row_local = torch.as_tensor(row_local, device=self.device)  # (N,) its row in that partition
        self.held = [p for p, c in enumerate(clients) if c is not None]

    def _fan_out(self, method: str, args_of) -> list:
        """method called on every partition that holds documents, args_of(p) its arguments -> their results in
        the order of `held`, all submitted before any is awaited."""
        pending = [self.clients[p].submit(method, *args_of(p)) for p in self.held]
        out = []
        for p, value in zip(self.held, pending, strict=True):
            out.append(self.clients[p].gather([value])[0])
        return out

    def search(self, query_emb: torch.Tensor, k: int) -> torch.Tensor:
        """query_emb (Q, dim) -> hits (Q, k) int64 global rows (-1 where fewer): the searcher
        (engine.retrieval.Retrieval) of a collection."""
        query = query_emb.detach().to("cpu", torch.float32).contiguous().numpy()
        got = self._fan_out("search", lambda p: (query, min(k, len(self.layout.part_rows[p]))))
        ids = [to_global(r, self.layout.part_rows[p]) for p, (_, r) in zip(self.held, got, strict=True)]
        return merge_top([s for s, _ in got], ids, k, self.device)[1]

    def dots(self, query: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """query (Q, dim) float32, rows (Q, L) int64 global, valid (Q, L) bool -> (Q, L) float32 query . row where
        valid, 0 elsewhere (as kernels.gather.gathered_dots over one store's vectors)."""
        out = torch.zeros(rows.shape, dtype=torch.float32, device=self.device)
        if rows.numel() == 0:
            return out
        who, col = valid.nonzero(as_tuple=True)
        g = rows[who, col]
        part = self.row_part[g]
        local = self.row_local[g]
        q = query.detach().to("cpu", torch.float32).contiguous().numpy()
        pending = []  # every block of every partition submitted before any is awaited
        for p in self.held:
            mine = (part == p).nonzero().squeeze(1)
            for lo in range(0, mine.numel(), DOTS_BLOCK_ENTRIES):
                at = mine[lo : lo + DOTS_BLOCK_ENTRIES]
                pending.append((p, at, self.clients[p].submit(
                    "dots", q, who[at].to(torch.int32).cpu().numpy(), local[at].to(torch.int32).cpu().numpy())))
        for p, at, value in pending:
            out[who[at], col[at]] = torch.tensor(self.clients[p].gather([value])[0], device=self.device)
        return out

    def _scatter_rows(self, parts: list[np.ndarray], dtype, width: int | None = None) -> torch.Tensor:
        shape = (self.n_total,) if width is None else (self.n_total, width)
        out = np.zeros(shape, dtype)
        for p, values in zip(self.held, parts, strict=True):
            out[self.layout.part_rows[p]] = values if width is None else values[:, :width]
        return torch.as_tensor(out, device=self.device)

    def neighbour_dots(self, width: int) -> torch.Tensor:
        """(N, >= width) float32: every partition's StoreTables.neighbour_dots in global rows."""
        got = self._fan_out("neighbour_dots", lambda p: (width,))
        return self._scatter_rows(got, np.float32, min(g.shape[1] for g in got) if got else width)

    def block_stats(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """kind -> sizes (N,) int32, norms (N,) float32: every partition's StoreTables.block_stats."""
        got = self._fan_out("block_stats", lambda p: (kind,))
        return (self._scatter_rows([s for s, _ in got], np.int32), self._scatter_rows([n for _, n in got],
                                                                                     np.float32))

    def _path_emb(self, heading_emb: torch.Tensor, p: int) -> np.ndarray:
        """The collection's vectors of partition p's heading paths (H_p, dim) float32."""
        emb = heading_emb.detach().to("cpu", torch.float32).numpy()
        ids = self.layout.path_ids[p]
        return np.ascontiguousarray(emb[ids]) if len(ids) else np.zeros((0, emb.shape[1]), np.float32)

    def heading_row_dots(self, heading_emb: torch.Tensor) -> torch.Tensor:
        """heading_emb (H, dim) float32 -> (N,) float32 each row's dot with its heading path's vector."""
        got = self._fan_out("row_path_dots", lambda p: (self._path_emb(heading_emb, p),))
        return self._scatter_rows(got, np.float32)

    def passage_path_dots(self, heading_emb: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """heading_emb (H, dim) float32, path (P,) the passages' paths -> (P,) float32 each passage's dot with
        its path's vector (0 without one)."""
        out = np.zeros(path.shape[0], np.float32)
        got = self._fan_out("passage_path_dots", lambda p: (self._path_emb(heading_emb, p),))
        for p, values in zip(self.held, got, strict=True):
            out[self.layout.passage_ids[p]] = values
        return torch.as_tensor(out, device=self.device)

    def passage_topk(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query (Q, dim) float32, k -> cos (Q, k) float32 descending and global passage ids (Q, k) int64, equal
        scores lower id first (as PassageTier.top_cosine over one store's passages)."""
        q = query.detach().to("cpu", torch.float32).contiguous().numpy()
        got = self._fan_out("passage_topk", lambda p: (q, min(k, len(self.layout.passage_ids[p]))))
        ids = [to_global(i, self.layout.passage_ids[p]) for p, (_, i) in zip(self.held, got, strict=True)]
        return merge_top([c for c, _ in got], ids, k, self.device)

    def peak_rss(self) -> list[int]:
        """Each serving partition's process peak resident memory in bytes (VmHWM), in the order of `held`."""
        return self._fan_out("peak_rss", lambda p: ())


def local_partitions(store, device: torch.device) -> PartitionedVectors:
    """A collection opened without its vectors (engine.store.collection_reader.open_collection(vectors=False))
    -> its partitions served in this process, one after another."""
    layout = store.layout
    clients = [LocalClient(PartitionServer(str(path), "cpu")) if held else None
               for path, held in zip(layout.paths, layout.held, strict=True)]
    return PartitionedVectors(layout, clients, device)
