"""Ray and its nodes: starting or joining Ray, placing actors, copying files to other nodes."""
