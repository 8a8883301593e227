"""Triton Python-backend model: y = x @ W (W 256 x 256, fixed seed)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x @ self.w)]))
        return out
