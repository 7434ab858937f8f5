package e2e

import (
	"fmt"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// outcome is what one request produced: a response or an error.
type outcome struct {
	resp proto.Message // nil if err is set
	err  error
}

// normalizeHeaders zeroes cluster_id, member_id and raft_term in every
// ResponseHeader inside m, nested Txn responses included: those differ
// between any two clusters; the revision is the part that must agree.
func normalizeHeaders(m protoreflect.Message) {
	if m.Descriptor().FullName() == (&pb.ResponseHeader{}).ProtoReflect().Descriptor().FullName() {
		h := m.Interface().(*pb.ResponseHeader)
		h.ClusterId, h.MemberId, h.RaftTerm = 0, 0, 0
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				normalizeHeaders(l.Get(i).Message())
			}
		case fd.IsMap():
		case fd.Message() != nil:
			normalizeHeaders(v.Message())
		}
		return true
	})
}

// render prints an outcome in a stable, readable text form: the response
// in protobuf text format (bytes as quoted strings), or the error's gRPC
// code and message.
func render(o outcome) string {
	if o.err != nil {
		st, _ := status.FromError(o.err)
		return fmt.Sprintf("error: code=%s message=%q", st.Code(), st.Message())
	}
	if o.resp == nil {
		return "<nil response>"
	}
	b, err := prototext.MarshalOptions{Multiline: true, Indent: "  ", EmitUnknown: true}.Marshal(o.resp)
	if err != nil {
		return fmt.Sprintf("<unprintable %T: %v>", o.resp, err)
	}
	return string(b)
}

// sameOutcome reports whether two outcomes agree: equal responses after
// header normalisation, or errors with the same gRPC code and message.
func sameOutcome(a, b outcome) bool {
	if (a.err != nil) != (b.err != nil) {
		return false
	}
	if a.err != nil {
		sa, _ := status.FromError(a.err)
		sb, _ := status.FromError(b.err)
		return sa.Code() == sb.Code() && sa.Message() == sb.Message()
	}
	return proto.Equal(a.resp, b.resp)
}

// lineDiff returns a line diff of want and got ("-" only in want, "+" only
// in got, " " both), from a longest common subsequence of lines.
func lineDiff(want, got string) string {
	a := strings.Split(strings.TrimRight(want, "\n"), "\n")
	b := strings.Split(strings.TrimRight(got, "\n"), "\n")
	// lcs[i][j] is the LCS length of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var sb strings.Builder
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			fmt.Fprintf(&sb, "  %s\n", a[i])
			i++
			j++
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			fmt.Fprintf(&sb, "- %s\n", a[i])
			i++
		default:
			fmt.Fprintf(&sb, "+ %s\n", b[j])
			j++
		}
	}
	return sb.String()
}
