"""gossiprl: a ZeroMQ message-passing runtime for gossip-based distributed deep RL (PALA / GALA).

The comms layer (topologies, wire, broker, client) needs only pyzmq, msgpack and numpy.
The RL half (A2C agents, Atari, logging) is the ``rl`` extra. torch is deliberately not
pinned here: install the build that fits the machine first (``pip install torch==2.13.0``
takes the CPU wheel on our CPU machines), and the ``torch>=2.1`` range below installs nothing more.
MinAtar (the CPU-scale Atari stand-in the experiments use) is its own extra, ``minatar``: it pulls
pandas, scipy and seaborn, which nothing else needs. ``baselines`` is Stable-Baselines3, the well-known
library experiments/baselines.py runs as a reference; pinned to a release that takes the torch already
installed (it needs torch>=2.8), so it pulls no other torch build.
"""

from setuptools import find_packages, setup

setup(
    name="gossiprl",
    version="0.1.0",
    description="ZeroMQ gossip runtime for decentralised actor-learner RL (PALA, GALA)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # tomllib (stdlib from 3.11) reads --config TOML files
    packages=find_packages(include=["gossiprl", "gossiprl.*", "topologies", "topologies.*"]),
    install_requires=["pyzmq>=25", "msgpack>=1.0", "numpy>=1.24", "click>=8.1"],
    extras_require={
        "rl": [
            "torch>=2.1",
            "gymnasium>=1.0",
            "ale-py>=0.10",
            "tensorboard>=2.14",
            "matplotlib>=3.7",
            "tqdm>=4.60",
            "moviepy>=1.0",
            "pygame>=2.1",
            "opencv-python-headless>=4.8",
            "pyyaml>=6",
        ],
        "monitor": ["prometheus-client>=0.17", "rich>=13"],
        "track": ["wandb>=0.16"],
        "minatar": ["minatar==1.0.15"],
        "baselines": ["stable-baselines3==2.9.2"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.2",
            "hypothesis>=6.80",
            "prometheus-client>=0.17",
            "rich>=13",
            "ruff==0.17.6",  # pinned: a newer ruff may format differently, and CI checks the format
        ],
    },
    entry_points={"console_scripts": ["gossiprl=gossiprl.cli:main"]},
)
