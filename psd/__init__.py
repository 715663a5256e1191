"""psd, the irdma parameter-server daemon (installed as the ``irdma_psd`` package)."""
