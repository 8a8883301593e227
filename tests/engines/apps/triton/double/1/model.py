"""Triton Python-backend model: z = 2 y (the second step of the ``pipeline`` ensemble)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            y = pb_utils.get_input_tensor_by_name(r, "y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("z", y * 2)]))
        return out
