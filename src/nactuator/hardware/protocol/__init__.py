"""Wire formats of the two servo buses, written from the vendor manuals.

``dxl2`` is DYNAMIXEL Protocol 2.0 (CRC-16, byte stuffing, fast sync read); ``scs`` is the
Feetech SCS/STS protocol (one-byte checksum, sign-magnitude fields). The emulators speak
them; the buses use the vendor SDKs and only borrow the decoders from here.
"""
