"""Imported first by the forkservers agents and actor processes start from: they ignore SIGTERM.

A scheduler's SIGTERM reaches every process of the job (scancel, systemd, docker stop), the server
too. A dead server cannot report its children's exits (multiprocessing reads each as code 255), so
the launcher took agents that were still writing their final checkpoint for dead ones, and a
learner its actors. The server needs no signal to end: it ends when the process that started it
does (multiprocessing closes its pipe). Its children inherit the ignored SIGTERM; an agent takes it
as a stop, an actor leaves the stop to its learner.
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
