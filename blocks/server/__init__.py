"""The SERVER HELPERS block of the server scripts: the vLLM server's flags and process, one page's
request, the send loop and its window, the server scripts' options.

Edit a module here, then run `python tools/sync_helpers.py` (see blocks/common/__init__.py).
"""

# The block's imports not already in the common block (see blocks/common/__init__.py).
import asyncio
import base64
import functools
import socket
import ssl
import urllib.parse
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import httpx

BLOCK = "SERVER HELPERS"
MODULES = [
    "serve_args",
    "process",
    "requests",
    "pipeline",
    "arguments",
]
