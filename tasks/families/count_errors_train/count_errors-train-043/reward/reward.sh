#!/usr/bin/env bash
set -euo pipefail
python3 /root/.openclaw/workspace/reward/check.py /root/.openclaw/workspace | python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(sum(d.values()) / len(d))'
