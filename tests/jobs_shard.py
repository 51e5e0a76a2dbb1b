"""One fake Job's container (tests/test_jobs.py): runs a model script's main() as its own
process, its Hub the FakeHub folder FAKE_HUB_ROOT, a Hub INPUT read from FAKE_HUB_ROOT/<repo>
(the Job's dataset download), everything else as the script does it.

    FAKE_HUB_ROOT=/tmp/hub python tests/jobs_shard.py SCRIPT INPUT OUTPUT [args...]
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import datasets  # noqa: E402
from conftest import FakeHub, load_script  # noqa: E402

hub_root = Path(os.environ["FAKE_HUB_ROOT"])
module = load_script(Path(sys.argv[1]).name)
load_dataset = datasets.load_dataset


def load_from_fake_hub(path, *args, revision=None, token=None, **kwargs):
    folder = hub_root / str(path)
    if folder.is_dir() and not Path(str(path)).exists():
        return load_dataset(str(folder), *args, **kwargs)
    return load_dataset(path, *args, revision=revision, token=token, **kwargs)


datasets.load_dataset = load_from_fake_hub
# the revision the launcher resolved, or the one FakeJobs.dataset_info answers (a check that
# resolves none would record another run than its shards)
module.hub_dataset_sha = lambda args: args.revision or "0123456789abcdef0123456789abcdef01234567"
sys.exit(module.main(sys.argv[2:], hub_api=FakeHub(hub_root)))
