"""naiad as PID 1: a container's entry point (``docker run IMAGE serve``, as SageMaker starts it, without ``--init``).

PID 1 is not an ordinary place for a server. The kernel delivers it no signal it has no handler for, so a SIGTERM
while models load (before the event loop sets its handlers) would do nothing; and every orphan of the container is
reparented to it, so unless it reaps them they stay zombies. tini and dumb-init answer both by staying PID 1
themselves and running the program as their child, and naiad does the same when it finds itself PID 1: it forks;
the child runs naiad exactly as it runs anywhere else (its workers and front ends are the child's children, so
their exit codes reach the child's ``Popen`` objects, not this reaper), and PID 1 forwards signals to the child,
reaps whatever is reparented to it, and exits with the child's status.

The child leads a process group of its own, so a Ctrl-C at a terminal (``docker run -it``) reaches it once, as
forwarded here, not twice (the terminal signals PID 1's group).
"""

from __future__ import annotations

import os
import signal
from types import FrameType

# What an init passes on (tini's set): termination and the user's signals. Not SIGCHLD (ours to read), nor the
# ones that can't be caught, nor the synchronous faults.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGCONT)


def become_init() -> int | None:
    """When this process is PID 1: fork; in the child, return None (go on as naiad); in PID 1, supervise the child
    and return the exit code to leave with. Anywhere else, return None at once."""
    if os.getpid() != 1:
        return None
    # Blocked across the fork: a signal that arrives in between waits for the handler (parent) or the default
    # action (child) instead of being lost.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return None
    return _supervise(child, old_mask)


def _supervise(child: int, old_mask: set[int | signal.Signals]) -> int:
    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass  # it exited; its status is being reaped

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    while True:
        try:
            pid, status = os.wait()  # any child: ours, or an orphan the kernel gave us (PEP 475 retries EINTR)
        except ChildProcessError:
            return 1  # (the child is always ours to wait for: not reached)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            # What a shell reports for a child killed by a signal; the namespace's other processes die with us.
            return code if code >= 0 else 128 - code
