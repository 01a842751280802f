"""What the openrlhf backend needs only on a machine without a GPU: logical GPUs and CPU flags (``launch``), the
CPU answers to OpenRLHF's ``torch.cuda`` calls (``device``), the gloo weight sync (``weight_sync``), fp32 training
(``precision``), ZeRO-3 gathers that finish before they are read (``zero3_gathers``) and the ``flash_attn``
import stand-in. None of it runs on a GPU cluster."""
