// Package source reads remote trees that a sync seals into versions: a
// Hugging Face Hub repository (hf://), an S3 prefix (s3://), a Google Cloud
// Storage prefix (gs://) and files served over HTTP(S).
//
// # Source
//
// Every source implements push.Source and push.Remote, so push.Push
// streams it into chunks without a local copy. Walk lists the tree once and
// pins it (the Hub commit a revision resolves to, the GCS generation of each
// object); Open returns an io.ReaderAt that fetches the file in ranged GETs,
// several in parallel ahead of the reader, with a bounded number of bytes in
// memory.
//
// # Verification
//
// Where the store gives a digest of a file (the Hub's SHA-256 of LFS files
// and git blob SHA-1 of the others, GCS's MD5, a SHA-256 in a URL list), the
// reader hashes the bytes as Push reads them and fails the read that reaches
// the end of the file when they disagree, so a push of a corrupt file fails
// before anything is sealed.
//
// # Network
//
// Requests reach only public addresses unless Options allow private or
// link-local ones (or a configured endpoint is on such an address): the
// check is made at dial time on every resolved address, for the first URL,
// every redirect and every list entry alike, so a source cannot have a
// metadata service's answer sealed into a version.
//
// # Credentials
//
// Tokens are read from the environment (HF_TOKEN, the AWS credential chain,
// GOOGLE_OAUTH_ACCESS_TOKEN), sent only to the host they belong to (never to
// a CDN a request is redirected to), and never appear in errors: URLs in
// errors lose their query strings.
package source
