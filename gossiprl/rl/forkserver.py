"""Imported first by the forkservers agents and actor processes start from: the server ignores SIGTERM.

A scheduler's SIGTERM reaches every process of the job (scancel, systemd, docker stop), the server
too. A dead server cannot report its children's exits (multiprocessing reads each as code 255), so
the launcher took agents that were still writing their final checkpoint for dead ones, and a
learner its actors. The server needs no signal to end: it ends when the process that started it
does (multiprocessing closes its pipe). What it forks gets SIGTERM's default back, as any process
forked from a server that had not imported this would have it (a forkserver is shared by the whole
process, and an ignored signal would outlive even an exec); agents and actors then set their own.
Only a forkserver preload imports this.
"""

import os
import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
