package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v2"
)

// etcd's configuration file (--config-file): YAML whose keys are etcd's
// flag names (name, data-dir, listen-client-urls, initial-cluster, ...),
// with TLS under client-transport-security and peer-transport-security.
// etcd reads it into its embed.Config through JSON, so durations are
// integer nanoseconds (600000000000 for 10m), lists are YAML sequences or
// comma-separated strings, and keys it does not know are ignored. strata
// reads each key into the flag of the same name, so every rule and refusal
// of the flags applies to the file alike; strata's own flags (log-dir, ...)
// may be given the same way.

// transportSecurityKeys map the keys of client-transport-security and
// peer-transport-security to strata's flags.
var transportSecurityKeys = map[string]map[string]string{
	"client-transport-security": {
		"cert-file": "cert-file", "key-file": "key-file", "client-cert-file": "client-cert-file", "client-key-file": "client-key-file",
		"client-cert-auth": "client-cert-auth", "trusted-ca-file": "trusted-ca-file", "auto-tls": "auto-tls",
		"allowed-hostname": "client-cert-allowed-hostname", "crl-file": "client-crl-file",
	},
	"peer-transport-security": {
		"cert-file": "peer-cert-file", "key-file": "peer-key-file", "client-cert-file": "peer-client-cert-file",
		"client-key-file": "peer-client-key-file", "client-cert-auth": "peer-client-cert-auth", "trusted-ca-file": "peer-trusted-ca-file",
		"auto-tls": "peer-auto-tls", "allowed-cn": "peer-cert-allowed-cn", "allowed-hostname": "peer-cert-allowed-hostname",
		"skip-client-san-verification": "peer-skip-client-san-verification", "crl-file": "peer-crl-file",
	},
}

// applyConfigFile sets fs's flags from the YAML file at path. Keys that
// name no flag are ignored, as etcd ignores them, with a warning on stderr.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		value := doc[key]
		if value == nil {
			continue
		}
		if mapping, ok := transportSecurityKeys[key]; ok {
			sub, ok := value.(map[any]any)
			if !ok {
				return fmt.Errorf("invalid %s", key)
			}
			for k, v := range sub {
				name, ok := mapping[fmt.Sprint(k)]
				if !ok {
					return fmt.Errorf("config file %s: %s.%v: strata does not support it", path, key, k)
				}
				if err := setFromConfig(fs, name, key+"."+fmt.Sprint(k), v); err != nil {
					return fmt.Errorf("config file %s: %w", path, err)
				}
			}
			continue
		}
		switch key {
		case "config-file":
			continue
		case "experimental-snapshot-catch-up-entries":
			// etcd 3.6 wrote this spelling of the key; it reads it as
			// experimental-snapshot-catchup-entries.
			if err := setFromConfig(fs, "snapshot-catchup-entries", key, value); err != nil {
				return fmt.Errorf("config file %s: %w", path, err)
			}
			continue
		case "socket-options":
			sub, _ := value.(map[any]any)
			for k, v := range sub {
				if err := setFromConfig(fs, "socket-"+fmt.Sprint(k), key+"."+fmt.Sprint(k), v); err != nil {
					return fmt.Errorf("config file %s: %w", path, err)
				}
			}
			continue
		case "discovery-config":
			if err := applyDiscoveryConfig(fs, value); err != nil {
				return fmt.Errorf("config file %s: %w", path, err)
			}
			continue
		}
		if fs.Lookup(key) == nil {
			fmt.Fprintf(os.Stderr, "strata: config file %s: ignoring unknown key %q, as etcd does\n", path, key)
			continue
		}
		if err := setFromConfig(fs, key, key, value); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	return nil
}

// discoveryConfigKeys map the keys of discovery-config (etcd's
// v3discovery.DiscoveryConfig: the token, and clientv3.ConfigSpec under
// "client") to the --discovery-* flags. A key mapped to "" is accepted and
// ignored: the client's message size limits, which the few small messages
// of discovery never reach.
var discoveryConfigKeys = map[string]string{
	"token":                                  "discovery-token",
	"client.endpoints":                       "discovery-endpoints",
	"client.dial-timeout":                    "discovery-dial-timeout",
	"client.request-timeout":                 "discovery-request-timeout",
	"client.keepalive-time":                  "discovery-keepalive-time",
	"client.keepalive-timeout":               "discovery-keepalive-timeout",
	"client.secure.cert":                     "discovery-cert",
	"client.secure.key":                      "discovery-key",
	"client.secure.cacert":                   "discovery-cacert",
	"client.secure.insecure-transport":       "discovery-insecure-transport",
	"client.secure.insecure-skip-tls-verify": "discovery-insecure-skip-tls-verify",
	"client.auth.username":                   "discovery-user",
	"client.auth.password":                   "discovery-password",
	"client.max-request-bytes":               "",
	"client.max-recv-bytes":                  "",
}

// applyDiscoveryConfig sets the --discovery-* flags from the file's
// discovery-config block. A key strata does not map (client.secure.server-name,
// client.auth.token: no flag carries them) is refused rather than ignored,
// since ignoring it would change whom discovery trusts or how it
// authenticates.
func applyDiscoveryConfig(fs *flag.FlagSet, value any) error {
	var walk func(prefix string, v any) error
	walk = func(prefix string, v any) error {
		if sub, ok := v.(map[any]any); ok {
			for k, sv := range sub {
				if err := walk(prefix+fmt.Sprint(k)+".", sv); err != nil {
					return err
				}
			}
			return nil
		}
		key := strings.TrimSuffix(prefix, ".")
		name, ok := discoveryConfigKeys[key]
		switch {
		case v == nil:
			return nil // as etcd: an empty value leaves the default
		case !ok:
			return fmt.Errorf("discovery-config.%s: strata does not support it", key)
		case name == "":
			return nil
		}
		return setFromConfig(fs, name, "discovery-config."+key, v)
	}
	if value == nil {
		return nil
	}
	if _, ok := value.(map[any]any); !ok {
		return errors.New("invalid discovery-config")
	}
	return walk("", value)
}

// setFromConfig sets flag name from a YAML value found at key: a sequence
// sets a repeatable flag once per item and any other flag to the items
// joined by commas; a number sets a duration flag as nanoseconds.
func setFromConfig(fs *flag.FlagSet, name, key string, value any) error {
	fl := fs.Lookup(name)
	if fl == nil {
		return fmt.Errorf("%s: strata has no flag --%s", key, name)
	}
	set := func(s string) error {
		if err := fs.Set(name, s); err != nil {
			return fmt.Errorf("%s: invalid value %q: %w", key, s, err)
		}
		return nil
	}
	if items, ok := value.([]any); ok {
		var parts []string
		for _, it := range items {
			parts = append(parts, fmt.Sprint(it))
		}
		if _, repeatable := fl.Value.(*stringList); repeatable {
			for _, p := range parts {
				if err := set(p); err != nil {
					return err
				}
			}
			return nil
		}
		return set(strings.Join(parts, ","))
	}
	if isDurationFlag(fl) {
		switch n := value.(type) {
		case int:
			return set(time.Duration(n).String())
		case float64:
			if n != math.Trunc(n) {
				break
			}
			return set(time.Duration(n).String())
		}
		return fmt.Errorf("%s: %v: a duration must be integer nanoseconds in the file (e.g. 600000000000 for 10m), as etcd reads it", key, value)
	}
	switch v := value.(type) {
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return set(strconv.FormatInt(int64(v), 10))
		}
		return set(strconv.FormatFloat(v, 'g', -1, 64))
	default:
		return set(fmt.Sprint(v))
	}
}

// isDurationFlag reports whether fl holds a time.Duration.
func isDurationFlag(fl *flag.Flag) bool {
	if _, ok := fl.Value.(*durationValue); ok {
		return true
	}
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, ok = g.Get().(time.Duration)
	return ok
}
