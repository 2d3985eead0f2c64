"""Benchmarks behind ``gossiprl bench``: each prints measured figures beside a baseline taken in the same run.

``comms`` (one parameter set: memcpy, raw relay, gossiprl, the PALA paper's path; mixing vs axpy),
``planes`` (ring rounds over each data plane next to GALA-style shm and gloo), ``scale`` (rounds
across network-namespace hosts on shaped links) and ``train`` (training frames/s against the
simulator's own rate).
"""
