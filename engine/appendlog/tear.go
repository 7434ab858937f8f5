package appendlog

import "math/rand/v2"

// TearModes is the number of ways Tear damages unsynced bytes.
const TearModes = 5

// Tear returns a function for CrashCopy that leaves of the unsynced bytes
// what a power cut may: mode 0 nothing; 1 a prefix torn at any byte; 2 all
// of them followed by garbage; 3 a prefix followed by zeros (the file grew,
// the data never came); 4 all of them with one byte damaged (a sector lost
// in the middle). Random choices come from rng.
func Tear(rng *rand.Rand, mode int) func(synced, unsynced []byte) []byte {
	return func(synced, rest []byte) []byte {
		data := synced
		if len(rest) == 0 {
			return data
		}
		switch mode {
		case 1:
			data = append(data, rest[:rng.IntN(len(rest)+1)]...)
		case 2:
			data = append(data, rest...)
			for range 1 + rng.IntN(64) {
				data = append(data, byte(rng.Uint32()))
			}
		case 3:
			data = append(data, rest[:rng.IntN(len(rest)+1)]...)
			data = append(data, make([]byte, 1+rng.IntN(600))...)
		case 4:
			n := len(data)
			data = append(data, rest...)
			data[n+rng.IntN(len(rest))] ^= 0x5a
		}
		return data
	}
}
