"""NEFTune under packing: each example of a packed row gets the noise it would get alone.

transformers' NEFTune (``neftune_noise_alpha``) adds uniform noise to the input embeddings, scaled by the
row's length ``L`` and the hidden size ``d``::

    |noise| <= alpha / sqrt(L * d)
    one example of 100 tokens, alone             L = 100   alpha / sqrt(100 d)
    packed row of four such examples             L = 400   half that, for each of the four
    here: L = the length of each token's example           alpha / sqrt(100 d), as alone

``PackingTrainer`` takes NEFTune over from the Trainer: a forward pre-hook on the model (and its base
model, which PEFT calls) reads the batch's examples (``packing_collators.batch``: ``cu_seq_lens_q``, else
restarting ``position_ids``; a batch of one example per row keeps the row's length, as transformers does), and
a forward hook on the input embeddings adds the noise in training. A stock ``Trainer`` with
``PackingCheckCallback`` and NEFTune is refused (``refuse_row_scaled_neftune``), naming the fix.
Cost: one (B, T) tensor of lengths per training forward.
"""

from __future__ import annotations

from transformers import TrainerCallback

from .._model_unwrap import unwrap_model

__all__ = ["PackedNEFTune", "refuse_row_scaled_neftune"]


def refuse_row_scaled_neftune(model) -> None:
    """Raise a ValueError when transformers' own NEFTune hook is on ``model``'s input embeddings: it scales the
    noise by the packed row's length."""
    embeddings = unwrap_model(model).get_input_embeddings()
    alpha = getattr(embeddings, "neftune_noise_alpha", None)
    hooks = embeddings._forward_hooks.values()
    if not any(getattr(hook, "__name__", "") == "neftune_post_forward_hook" for hook in hooks):
        return
    raise ValueError(
        f"NEFTune (neftune_noise_alpha={alpha}) scales its noise by the length of the batch's row: in a packed row of "
        "n examples each gets 1/sqrt(n) of the noise it gets padded. Train with PackingTrainer, which scales it per "
        "example, or set neftune_noise_alpha=None."
    )


class PackedNEFTune(TrainerCallback):
    """NEFTune's noise per example, installed when training begins and removed when it ends.

    >>> PackedNEFTune(5.0).alpha
    5.0
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = float(alpha)
        self.lengths = None  # (B, T, 1): each token's example length, of the batch being run
        self.handles: list = []

    def attach(self, model) -> None:
        """Hook ``model`` (or the transformers model inside its wrappers)."""
        import torch

        model = unwrap_model(model)
        base = getattr(model, "base_model", None)
        for module in {id(m): m for m in (model, base) if isinstance(m, torch.nn.Module)}.values():
            self.handles.append(module.register_forward_pre_hook(self.read_lengths, with_kwargs=True))
        self.handles.append(model.get_input_embeddings().register_forward_hook(self.add_noise))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.lengths = [], None

    def read_lengths(self, module, args: tuple, kwargs: dict) -> None:
        import torch

        from ..batch import segment_ids

        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if not isinstance(tokens, torch.Tensor):
            return
        shape = tuple(tokens.shape[:2])
        ids = segment_ids(kwargs, shape).reshape(-1)  # one example per row: the row's length, as transformers scales it
        sizes = torch.bincount(ids)
        self.lengths = sizes[ids].reshape(*shape, 1).to(tokens.device)

    def add_noise(self, module, args: tuple, output):
        import torch

        if not module.training:
            return output
        lengths = self.lengths
        if lengths is None or tuple(lengths.shape[:2]) != tuple(output.shape[:2]):
            lengths = torch.full((*output.shape[:2], 1), output.shape[1], device=output.device)
        magnitude = self.alpha / torch.sqrt(lengths.to(output.dtype) * output.shape[-1])
        return output + torch.empty_like(output).uniform_(-1, 1) * magnitude

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and not self.handles:
            self.attach(model)

    def on_train_end(self, args, state, control, **kwargs):
        self.detach()
