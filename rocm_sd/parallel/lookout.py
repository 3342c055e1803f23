"""How every rank learns within seconds that the job is over when no collective can tell it.

checked() (rounds.py) ends a failed step on every rank when every rank can reach its agreement. Two
cases are out of its reach:

  * in cfg mode a rank that raises goes to the agreement while its partner waits inside the pair's
    all-gather of the UNet step for a half that will never come: each waits for the other until the
    process group's timeout;
  * a rank killed without a word (SIGKILL, a crash in native code) cannot say it was lost, and torchrun
    stops the other ranks with SIGTERM as soon as it sees the death, before they can say it either.

The failed rank cannot release its partner in band, by joining the gather the partner waits in with a
failure flag (a status element in the gathered tensor, a matching "abort" collective): it would have to
know which of the pair's gathers the partner is in, and of what shape, or that the partner has left its
gathers for the agreement, and a wrong guess hangs it instead. Nor can a collective in flight be cut
short from Python: gloo's abort() leaves an operation waiting until its timeout; on NCCL (RCCL) the host
thread is not in the all-gather at all (it was queued on the stream) but blocked at the next
synchronization, which only ncclCommAbort would end, a call torch offers as experimental and NCCL-only,
to run with its own error handling off; by default NCCL's watchdog ends such a process itself, at the
timeout. So the lookout works beside the collectives, through the job's store (torchrun's TCPStore), on a
thread of its own, the same way on both backends:

  * a rank whose step raised publishes its error before going to the agreement. Every rank's lookout
    sees it within POLL_S, leaves GRACE_S for the agreement to end the job the ordinary way, and then
    reports and ends its process: what NCCL's watchdog does at the timeout, at once and with the error.
    The failed ranks end first and the others outlive them by a moment, so that torchrun names a failed
    rank as the first failure (the root cause), not the rank that waited for it; so do ranks that end through
    the agreement (a failed rank's lookout beats on until its process has ended);
  * every lookout beats a counter. When a collective breaks, or SIGTERM comes, the ranks whose counter
    stands still through a roll call of ROLL_CALL_S are named as lost;
  * every lookout also publishes its rank's step and whether the rank waits in a collective. When a
    collective times out and no rank was lost, the ranks that were not waiting in one are the ones that
    stopped answering (a hung kernel, driver call or file system): the rank that gave up publishes that
    as their failure, their lookouts end them at once, and it outlives them by a moment, so that torchrun
    too names them as the first failure rather than the rank that waited;
  * a lookout whose launcher is gone (the process's parent changed: torchrun was killed) ends its process.

On GPUs: a CFG partner's host thread sits in a stream synchronization while its NCCL kernel waits for
the half that never comes; the lookout's os._exit ends the process, and with it the CUDA context and the
kernel. A rank lost on one host goes unnoticed by NCCL (its peers' kernels just wait), so there the report
comes from torchrun's SIGTERM and the roll call; on gloo the peers' sockets close and the collective
breaks at once, which also leads to the roll call. The CPU tests run gloo: every path of this module runs
there; NCCL's side of the story (where its host thread waits, peers that do not notice) they cannot show.

The per-step all-gather stays as it was: the thread wakes POLL_S apart for two store requests, and no
step waits on it.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
from typing import Callable

from .rounds import RankError, describe

POLL_S = 0.2
# Long enough for ranks that can reach the agreement to end the job there (it takes milliseconds).
GRACE_S = 1.0
# Every live rank beats within POLL_S, even with its main thread held in a collective or a kernel.
ROLL_CALL_S = 2.0
_KEY = "rocm_sd/lookout/"
_TERMINATED = 128 + signal.SIGTERM  # the shell's exit status for a process that SIGTERM ended


class Lookout:
    """One rank's watch on the others. start() it on every rank and publish() a step's error before the
    agreement; at the end, stop() it after a job that worked, or conclude() with the failure that ended it.

    `report(message)` says what ended the job (rank 0 in full, the others a line). The main thread and the
    lookout never both report: whichever takes `_ending` to end the job keeps it until the process ends."""

    def __init__(self, rank: int, world: int, store, report: Callable[[str], None], timeout_s: float | None = None):
        self.rank, self.world, self.store, self.report, self.timeout_s = rank, world, store, report, timeout_s
        self.step = "start-up"  # what this rank is doing, for the report: set by checked()
        self.waiting = False    # whether the main thread waits in a collective: set by rounds.waiting()
        self._state: tuple[str, bool] | None = None  # (step, waiting) as last published
        self._named: list[int] = []  # the ranks this one named as stalled, to outlive
        self._parent = os.getppid()  # the launcher
        self._ending = threading.Lock()
        self._stopped = threading.Event()
        self._beating_on = False  # after conclude(): the thread beats on, and does nothing else
        self._signals, self._signal_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._watch, name="rocm_sd lookout", daemon=True)
        self._sigterm_before = None  # (wake-up fd, handler) to put back

    def start(self) -> Lookout:
        self._beat()
        self._publish_state()
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self._catch_sigterm()
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more watching: the job worked. Blocks for good if the lookout is ending the process."""
        with self._ending:
            self._stopped.set()
        self._release_sigterm()
        self._thread.join(timeout=2 * POLL_S)

    def conclude(self, message: str) -> None:
        """Report the failure that the main thread caught, which then ends the process: the lookout reports
        nothing more, and SIGTERM (torchrun stopping the other ranks) waits until the report is out. Blocks
        for good if the lookout is ending the process already."""
        self._ending.acquire()
        self._beating_on = True  # for the ranks that outlive this one: its beats stop when its process ends
        self._stopped.set()
        try:
            self.report(message)
        finally:
            self._release_sigterm()
        try:
            failed = [f.rank for f in self.failures()]
        except Exception:  # noqa: BLE001 - the store left with torchrun's agent: nobody is left to outlive
            failed = []
        self._outlive(self._named + ([] if self.rank in failed else failed))

    def publish(self, error: RankError) -> None:
        try:
            self.store.set(f"{_KEY}failed/{error.rank}", pickle.dumps(error))
            self.store.add(f"{_KEY}failures", 1)
        except Exception:  # noqa: BLE001 - the store left with torchrun's agent: the agreement still tells
            pass

    def failures(self) -> list[RankError]:
        """Every error published so far, in rank order."""
        if not self._published():
            return []
        keys = [f"{_KEY}failed/{rank}" for rank in range(self.world)]
        return [pickle.loads(self.store.get(key)) for key in keys if self.store.check([key])]

    def lost_ranks(self) -> list[int]:
        """The other ranks whose beat stands still through a roll call: their processes are gone.

        Rank 0 calls the roll and ends it once every rank has answered. The other ranks beat on through the
        whole of ROLL_CALL_S before they end, so that they answer rank 0's roll call however late it began."""
        others = [rank for rank in range(self.world) if rank != self.rank]
        first, quiet = self._beats(others), others
        deadline = time.monotonic() + ROLL_CALL_S
        while (quiet or self.rank != 0) and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
            self._beat()
            now = self._beats(quiet)
            quiet = [rank for rank in quiet if now[rank] == first[rank]]
        return quiet

    def explain(self, step: str, name_stalled: bool = False) -> str:
        """Why the job broke, as far as the store knows: the ranks' published errors, else the lost ranks,
        else (with `name_stalled`: this rank's collective broke) the ranks that were not waiting in one, which
        are then published as failed; '' when none of these (a connection broke between live ranks)."""
        failures = self.failures()
        if failures:
            return describe(failures, trace=self.rank == 0)
        lost = self.lost_ranks()
        if lost or not name_stalled:
            return "\n".join(f"rank {rank} was lost during {step}: its process ended without reporting an error "
                             "(killed, or a crash in native code; torchrun's log has its exit code)" for rank in lost)
        stalled = self.stalled()
        for error in stalled:
            self.publish(error)
        self._named = [error.rank for error in stalled]
        return describe(stalled, trace=False) if stalled else ""

    def stalled(self) -> list[RankError]:
        """The other ranks that are alive but were not waiting in a collective when the last state was
        published (within POLL_S): the ones a collective that timed out waited for."""
        waited = f"{self.timeout_s:g} s (--timeout-s)" if self.timeout_s is not None else "the timeout"
        errors = []
        for rank in range(self.world):
            key = f"{_KEY}state/{rank}"
            if rank == self.rank or not self.store.check([key]):
                continue
            step, waiting = pickle.loads(self.store.get(key))
            if not waiting:
                errors.append(RankError(rank, step, f"stopped answering: rank {self.rank} waited {waited} for it "
                                        "while it was still working, outside any collective, with its process "
                                        "alive (a kernel, driver call or file access that hangs?)", "", stalled=True))
        return errors

    # ---- the thread --------------------------------------------------------------------------------

    def _watch(self) -> None:
        failure_seen_at = None
        while not self._stopped.is_set():
            terminated = self._wait_for_sigterm(POLL_S)
            if os.getppid() != self._parent:  # reparented: nothing will stop this process, nor wait for it
                self._end(f"rank {self.rank}: stopping during {self.step}, the launcher (pid {self._parent}) is "
                          "gone", 1)
            try:
                self._beat()
                self._publish_state()
                if terminated:
                    self._end(self.explain(self.step) or f"stopped by SIGTERM during {self.step}; every rank was "
                              "still running", _TERMINATED)
                if failure_seen_at is None and self._published():
                    failure_seen_at = time.monotonic()
                    if any(f.rank == self.rank and f.stalled for f in self.failures()):
                        self._end(self.explain(self.step), 1)  # first: the launcher then names this rank
                if failure_seen_at is not None and time.monotonic() - failure_seen_at >= GRACE_S:
                    failed = [f.rank for f in self.failures()]
                    self._end(self.explain(self.step), 1, outlive=[] if self.rank in failed else failed)
            except Exception as exc:  # noqa: BLE001 - the store left with torchrun's agent: nothing more to learn
                if terminated:
                    self._end(f"stopped by SIGTERM during {self.step} (the job's store: {exc})", _TERMINATED)
        while self._beating_on:  # concluded: beats (a daemon thread's) until the process ends, nothing else
            time.sleep(POLL_S)
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store left with torchrun's agent: nobody counts them
                return

    def _end(self, message: str, code: int, outlive: list[int] = ()) -> None:
        """Report and end the process, after the ranks `outlive` (a few seconds at most), unless the main thread
        has taken the ending over."""
        with self._ending:
            if self._stopped.is_set():
                return
            try:
                self.report(message)
                sys.stdout.flush()
                sys.stderr.flush()
                self._outlive(list(outlive))
            finally:
                os._exit(code)  # the main thread may be held in a collective: no clean exit can wait for it

    # ---- beats and signals -------------------------------------------------------------------------

    def _published(self) -> int:
        return self.store.add(f"{_KEY}failures", 0)

    def _beat(self) -> None:
        self.store.add(f"{_KEY}beat/{self.rank}", 1)

    def _beats(self, ranks: list[int]) -> dict[int, int]:
        return {rank: self.store.add(f"{_KEY}beat/{rank}", 0) for rank in ranks}

    def _publish_state(self) -> None:
        state = (self.step, self.waiting)
        if state != self._state:
            self.store.set(f"{_KEY}state/{self.rank}", pickle.dumps(state))
            self._state = state

    def _outlive(self, ranks: list[int]) -> None:
        """Wait, a few seconds at most, until `ranks` have ended (their beats stand still for 3 POLL_S)."""
        if not ranks:
            return
        try:
            deadline = time.monotonic() + GRACE_S + ROLL_CALL_S
            before, since = self._beats(ranks), time.monotonic()
            while time.monotonic() < deadline and time.monotonic() - since < 3 * POLL_S:
                time.sleep(POLL_S / 2)
                now = self._beats(ranks)
                if now != before:
                    before, since = now, time.monotonic()
        except Exception:  # noqa: BLE001 - the store left with torchrun's agent: nobody is left to outlive
            pass

    def _catch_sigterm(self) -> None:
        """SIGTERM wakes the lookout through Python's wake-up fd, which the C-level handler writes whatever
        the main thread is doing; a Python handler would wait for the main thread to run bytecode again."""
        self._signal_writer.setblocking(False)
        wakeup_fd = signal.set_wakeup_fd(self._signal_writer.fileno(), warn_on_full_buffer=False)
        self._sigterm_before = wakeup_fd, signal.signal(signal.SIGTERM, self._on_sigterm)

    def _release_sigterm(self) -> None:
        if self._sigterm_before is not None:
            wakeup_fd, handler = self._sigterm_before
            signal.signal(signal.SIGTERM, handler)
            signal.set_wakeup_fd(wakeup_fd)
            self._sigterm_before = None

    def _on_sigterm(self, signum, frame) -> None:
        """The Python-level handler, run by the main thread when it can. The lookout takes SIGTERM from the
        wake-up fd, and whichever holds `_ending` ends the process; only where neither will does SIGTERM
        end it the default way."""
        if not self._thread.is_alive() and not self._ending.locked():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _wait_for_sigterm(self, timeout_s: float) -> bool:
        """Sleep up to timeout_s; whether SIGTERM came (other signals with a Python handler, such as SIGINT,
        write their numbers to the wake-up fd too: they are left to their handlers)."""
        if not select.select([self._signals], [], [], timeout_s)[0]:
            return False
        return signal.SIGTERM in self._signals.recv(64)
