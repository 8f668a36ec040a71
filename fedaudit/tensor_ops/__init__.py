"""Tensor operations that methods and attacks share, with no notion of a federation: batch-norm
statistics, feature style, Fourier amplitudes, augmentations, losses, latent inversion, linear probes."""
