"""The COMMON HELPERS block of every script: the input, page images and PDFs, the output and its
parts, the run's identity, stats and card, the command line, the run's life cycle.

Edit a module here, then run `python tools/sync_helpers.py`: it joins the modules, in the order
below, into the block each script carries (one banner line per module, its docstring's first
line). A module's docstring and its imports from blocks/ stay out of the scripts: they tell ruff
and the tests where each name comes from (the model section's names from blocks/model.py).
"""

# The imports of all the block's modules (ruff checks them on every script).
import argparse
import contextlib
import ctypes
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import queue
import random
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

BLOCK = "COMMON HELPERS"
MODULES = [
    "model_options",
    "errors",
    "secrets",
    "inputs",
    "pages",
    "pdf",
    "loops",
    "rows",
    "plan",
    "store",
    "saving",
    "manifest",
    "stats",
    "jobs_command",
    "card",
    "arguments",
    "run",
]
