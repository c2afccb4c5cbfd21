"""Names the stack's parts and tests share."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GPU = "nvidia.com/gpu"
ISLAND = "example.com/fabric-block"
ADMISSION_LABEL = "quartermaster.dev/admission"
WORKLOAD_LABEL = "quartermaster.dev/workload"
TOKEN = "e2e-admin-token"
