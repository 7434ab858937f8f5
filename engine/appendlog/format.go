package appendlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The constants below are wire format (FORMAT.md): do not change them.
const (
	fileMagic   = "STRALOG1"
	headerSize  = 24
	frameHead   = 12 // length (4) + applied (8)
	frameTail   = 4  // CRC
	flagReset   = 1
	flagMarker  = 2
	kindSet     = 1
	kindDelete  = 2
	idStep      = 1 << 20
	maxFrame    = 256 << 20
	maxKeySize  = 64 << 10
	fileSuffix  = ".alog"
	tmpSuffix   = ".tmp"
	idNameWidth = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt marks data that fails a check: corruption is its own class
// of error (errors.Is(err, errCorrupt)).
var errCorrupt = errors.New("appendlog: corrupt data file")

// header is a data file's header.
type header struct {
	base  uint64
	flags uint32
}

func (h header) encode() []byte {
	b := make([]byte, headerSize)
	copy(b, fileMagic)
	binary.BigEndian.PutUint64(b[8:], h.base)
	binary.BigEndian.PutUint32(b[16:], h.flags)
	binary.BigEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	return b
}

func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("%w: header of %d bytes", errCorrupt, len(b))
	}
	if string(b[:8]) != fileMagic {
		return header{}, fmt.Errorf("%w: bad magic %q", errCorrupt, b[:8])
	}
	if got, want := binary.BigEndian.Uint32(b[20:]), crc32.Checksum(b[:20], castagnoli); got != want {
		return header{}, fmt.Errorf("%w: header CRC %08x, computed %08x", errCorrupt, got, want)
	}
	h := header{base: binary.BigEndian.Uint64(b[8:]), flags: binary.BigEndian.Uint32(b[16:])}
	if h.flags&^(flagReset|flagMarker) != 0 {
		return header{}, fmt.Errorf("%w: unknown header flags %#x", errCorrupt, h.flags)
	}
	return h, nil
}

// supersedes returns the id below which this file makes every file
// obsolete (0: none): an installed snapshot's own id, a merge marker's
// base. A merge's outputs carry the base too but supersede nothing by
// themselves: only the marker, written after all of them, does.
func (h header) supersedes(id uint64) uint64 {
	switch {
	case h.flags&flagReset != 0:
		return id
	case h.flags&flagMarker != 0:
		return h.base
	}
	return 0
}

func fileName(id uint64) string { return fmt.Sprintf("%0*x%s", idNameWidth, id, fileSuffix) }

// parseFileName returns the id of a data file's name, or false.
func parseFileName(name string) (uint64, bool) {
	if len(name) != idNameWidth+len(fileSuffix) || name[idNameWidth:] != fileSuffix {
		return 0, false
	}
	var id uint64
	for _, c := range name[:idNameWidth] {
		switch {
		case c >= '0' && c <= '9':
			id = id<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			id = id<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return id, true
}

// frameEncoder builds one frame. Records are appended with set and del;
// finish writes the length and the CRC. offsets are relative to the
// frame's start.
type frameEncoder struct {
	buf []byte
}

func (f *frameEncoder) reset(applied uint64) {
	f.buf = append(f.buf[:0], make([]byte, frameHead)...)
	binary.BigEndian.PutUint64(f.buf[4:], applied)
}

// set appends a set record and returns the value's offset in the frame.
func (f *frameEncoder) set(key, value []byte) int {
	f.buf = append(f.buf, kindSet)
	f.buf = binary.AppendUvarint(f.buf, uint64(len(key)))
	f.buf = binary.AppendUvarint(f.buf, uint64(len(value)))
	f.buf = append(f.buf, key...)
	off := len(f.buf)
	f.buf = append(f.buf, value...)
	return off
}

func (f *frameEncoder) del(key []byte) {
	f.buf = append(f.buf, kindDelete)
	f.buf = binary.AppendUvarint(f.buf, uint64(len(key)))
	f.buf = append(f.buf, key...)
}

func (f *frameEncoder) bodyLen() int { return len(f.buf) - frameHead }

// finish completes the frame and returns it.
func (f *frameEncoder) finish() ([]byte, error) {
	n := f.bodyLen()
	if n <= 0 || n > maxFrame {
		return nil, fmt.Errorf("appendlog: batch of %d encoded bytes (limit %d)", n, maxFrame)
	}
	binary.BigEndian.PutUint32(f.buf, uint32(n))
	f.buf = binary.BigEndian.AppendUint32(f.buf, crc32.Checksum(f.buf, castagnoli))
	return f.buf, nil
}

// record is one decoded record; key and value alias the frame's buffer.
type record struct {
	del        bool
	key, value []byte
	valueOff   int // offset of the value in the frame
}

// frameReader reads the frames of one file sequentially.
type frameReader struct {
	r   io.Reader
	off int64 // file offset of the next frame
	buf []byte
}

// next returns the next frame's applied index and body and its file
// offset. io.EOF means a clean end; errTorn an incomplete or bad frame
// at off (a torn tail, or corruption if the file was synced whole).
func (fr *frameReader) next() (applied uint64, body []byte, start int64, err error) {
	var head [frameHead]byte
	n, err := io.ReadFull(fr.r, head[:])
	if err == io.EOF {
		return 0, nil, fr.off, io.EOF
	}
	if err != nil {
		return 0, nil, fr.off, fmt.Errorf("%w: frame header at %d: %d bytes", errTorn, fr.off, n)
	}
	length := binary.BigEndian.Uint32(head[:4])
	if length == 0 || length > maxFrame {
		return 0, nil, fr.off, fmt.Errorf("%w: frame at %d: length %d", errTorn, fr.off, length)
	}
	need := int(length) + frameTail
	if cap(fr.buf) < frameHead+need {
		fr.buf = make([]byte, frameHead+need)
	}
	fr.buf = fr.buf[:frameHead+need]
	copy(fr.buf, head[:])
	if _, err := io.ReadFull(fr.r, fr.buf[frameHead:]); err != nil {
		return 0, nil, fr.off, fmt.Errorf("%w: frame at %d: body: %v", errTorn, fr.off, err)
	}
	end := frameHead + int(length)
	if got, want := binary.BigEndian.Uint32(fr.buf[end:]), crc32.Checksum(fr.buf[:end], castagnoli); got != want {
		return 0, nil, fr.off, fmt.Errorf("%w: frame at %d: CRC %08x, computed %08x", errTorn, fr.off, got, want)
	}
	start = fr.off
	fr.off += int64(frameHead + need)
	return binary.BigEndian.Uint64(head[4:]), fr.buf[:end], start, nil
}

// errTorn marks a frame that is incomplete or fails its CRC.
var errTorn = errors.New("torn or corrupt frame")

// decodeRecords calls fn with each record of a frame (with its frame
// header at body[:frameHead]). A malformed record is corruption: the CRC
// matched, so the writer wrote it.
func decodeRecords(frame []byte, fn func(r record) error) error {
	p := frameHead
	for p < len(frame) {
		kind := frame[p]
		p++
		klen, n := binary.Uvarint(frame[p:])
		if n <= 0 || klen == 0 || klen > maxKeySize {
			return fmt.Errorf("%w: record at %d: bad key length", errCorrupt, p)
		}
		p += n
		var vlen uint64
		switch kind {
		case kindSet:
			vlen, n = binary.Uvarint(frame[p:])
			if n <= 0 || vlen > maxFrame {
				return fmt.Errorf("%w: record at %d: bad value length", errCorrupt, p)
			}
			p += n
		case kindDelete:
		default:
			return fmt.Errorf("%w: record at %d: kind %d", errCorrupt, p-1, kind)
		}
		if uint64(len(frame)-p) < klen+vlen {
			return fmt.Errorf("%w: record at %d overruns its frame", errCorrupt, p)
		}
		r := record{del: kind == kindDelete, key: frame[p : p+int(klen)]}
		p += int(klen)
		r.valueOff = p
		r.value = frame[p : p+int(vlen)]
		p += int(vlen)
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// readHeader reads a file's header.
func readHeader(f *os.File) (header, int64, error) {
	b := make([]byte, headerSize)
	n, err := f.ReadAt(b, 0)
	if err != nil && err != io.EOF {
		return header{}, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return header{}, 0, err
	}
	h, err := decodeHeader(b[:n])
	return h, st.Size(), err
}
