"""Triton Python-backend model: sleeps ``s`` seconds per request (batches of one: each instance
serves one request at a time, so concurrency is the instance count), answers
the pid of the instance (each instance is its own stub process) that served it."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            s = pb_utils.get_input_tensor_by_name(r, "s").as_numpy()
            time.sleep(float(s.reshape(-1)[0]))
            pid = np.full((s.shape[0], 1), os.getpid(), dtype=np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("pid", pid)]))
        return out
