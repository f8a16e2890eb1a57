package k8swatch

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// kubeconfig is the part of a kubeconfig file (clientcmd's Config) read.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string
		Cluster struct {
			Server                   string
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			TLSServerName            string `yaml:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
		}
	}
	Users []struct {
		Name string
		User struct {
			Token                 string
			TokenFile             string `yaml:"tokenFile"`
			ClientCertificate     string `yaml:"client-certificate"`
			ClientCertificateData string `yaml:"client-certificate-data"`
			ClientKey             string `yaml:"client-key"`
			ClientKeyData         string `yaml:"client-key-data"`
			Exec                  any    `yaml:"exec"`
			AuthProvider          any    `yaml:"auth-provider"`
			Username              string
		}
	}
	Contexts []struct {
		Name    string
		Context struct {
			Cluster, User, Namespace string
		}
	}
}

// maxKubeconfig bounds the file read.
const maxKubeconfig = 4 << 20

// FromKubeconfig returns a client of path's current context: its
// cluster's server (https, verified by certificate-authority or
// certificate-authority-data, else the system roots; tls-server-name)
// and its user's token, tokenFile, or client certificate and key (files
// or -data). Relative file names are relative to path's directory.
// exec and auth-provider credential plugins, basic auth and
// insecure-skip-tls-verify are refused.
func FromKubeconfig(path string) (*Client, error) {
	fail := func(format string, args ...any) (*Client, error) {
		return nil, fmt.Errorf("kubeconfig %s: %s", path, fmt.Sprintf(format, args...))
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if st.Size() > maxKubeconfig {
		return fail("larger than %d bytes", maxKubeconfig)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return fail("%v", err)
	}
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	if kc.CurrentContext == "" {
		return fail("no current-context")
	}
	var ctxCluster, ctxUser, ns string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			ctxCluster, ctxUser, ns, found = c.Context.Cluster, c.Context.User, c.Context.Namespace, true
		}
	}
	if !found {
		return fail("current-context %q is not among its contexts", kc.CurrentContext)
	}
	tc := &tls.Config{}
	server := ""
	found = false
	for _, c := range kc.Clusters {
		if c.Name != ctxCluster {
			continue
		}
		found = true
		cl := c.Cluster
		if cl.InsecureSkipTLSVerify {
			return fail("cluster %q: insecure-skip-tls-verify is not supported: give its certificate-authority", c.Name)
		}
		u, err := url.Parse(cl.Server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fail("cluster %q: server %q: want https://host[:port]", c.Name, cl.Server)
		}
		server = u.Scheme + "://" + u.Host + u.Path
		var pem []byte
		switch {
		case cl.CertificateAuthorityData != "":
			if pem, err = base64.StdEncoding.DecodeString(cl.CertificateAuthorityData); err != nil {
				return fail("cluster %q: certificate-authority-data: %v", c.Name, err)
			}
		case cl.CertificateAuthority != "":
			if pem, err = os.ReadFile(rel(cl.CertificateAuthority)); err != nil {
				return fail("cluster %q: %v", c.Name, err)
			}
		}
		if pem != nil {
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return fail("cluster %q: its certificate authority holds no PEM certificate", c.Name)
			}
		}
		tc.ServerName = cl.TLSServerName
	}
	if !found {
		return fail("context %q names no known cluster %q", kc.CurrentContext, ctxCluster)
	}
	var ts *tokenSource
	found = false
	for _, u := range kc.Users {
		if u.Name != ctxUser {
			continue
		}
		found = true
		us := u.User
		switch {
		case us.Exec != nil, us.AuthProvider != nil:
			return fail("user %q: exec and auth-provider credential plugins are not supported: give a token, tokenFile or client certificate", u.Name)
		case us.Username != "":
			return fail("user %q: basic authentication is not supported", u.Name)
		case us.Token != "":
			ts = &tokenSource{tok: us.Token}
		case us.TokenFile != "":
			ts = &tokenSource{path: rel(us.TokenFile)}
			if _, err := ts.get(); err != nil {
				return fail("user %q: %v", u.Name, err)
			}
		}
		cert, key, err := pemPair(us.ClientCertificateData, us.ClientKeyData, rel(us.ClientCertificate), rel(us.ClientKey))
		if err != nil {
			return fail("user %q: %v", u.Name, err)
		}
		if cert != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return fail("user %q: client certificate: %v", u.Name, err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
	}
	if !found && ctxUser != "" {
		return fail("context %q names no known user %q", kc.CurrentContext, ctxUser)
	}
	return newClient(server, tc, ts, ns), nil
}

// pemPair is a client certificate and its key, each from -data (base64) or
// a file; nil, nil when neither is given.
func pemPair(certData, keyData, certFile, keyFile string) (cert, key []byte, err error) {
	read := func(data, file string) ([]byte, error) {
		switch {
		case data != "":
			return base64.StdEncoding.DecodeString(data)
		case file != "":
			return os.ReadFile(file)
		}
		return nil, nil
	}
	if cert, err = read(certData, certFile); err != nil {
		return nil, nil, err
	}
	if key, err = read(keyData, keyFile); err != nil {
		return nil, nil, err
	}
	if (cert == nil) != (key == nil) {
		return nil, nil, errors.New("a client certificate needs its key, and a key its certificate")
	}
	return cert, key, nil
}
