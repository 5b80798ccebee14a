"""Operations tools: the checks of `vgpuctl doctor` and the demo."""
