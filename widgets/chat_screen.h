// ChatScreen: console conversations streamed through the service's own endpoint.
#pragma once

#include <QHash>
#include <QJsonArray>
#include <QSet>
#include <QPlainTextEdit>
#include <QWidget>

#include "app/snapshots.h"
#include "widgets/confirm.h"

class ChatModel;
class QComboBox;
class QDoubleSpinBox;
class QLineEdit;
class QListWidget;
class QPushButton;
class QSpinBox;
class QLabel;
class QTextBrowser;
class QTimer;
class QUrl;

// The message box: an image dropped or pasted on it is attached (imageDropped) instead of inserted.
class ChatInput : public QPlainTextEdit {
  Q_OBJECT

 public:
  using QPlainTextEdit::QPlainTextEdit;

 signals:
  void imageDropped(const QByteArray& bytes);

 protected:
  bool canInsertFromMimeData(const QMimeData* source) const override;
  void insertFromMimeData(const QMimeData* source) override;
};

// GUI thread only. Owns one ChatModel a conversation; requests leave as signals.
class ChatScreen : public QWidget {
  Q_OBJECT

 public:
  explicit ChatScreen(QWidget* parent = nullptr);

  ChatModel* currentModel() const;
  QString currentConversation() const { return m_current; }
  QPlainTextEdit* input() const { return m_input; }
  // Attaches an image to the next message (PNG, JPEG or WebP bytes as they are; another format Qt reads
  // becomes PNG); false where the bytes are no image or over 20 MiB. Drops and pastes on the input come here.
  bool attachImage(const QByteArray& bytes);
  const QStringList& attachedImages() const { return m_images; }
  QPushButton* sendButton() const { return m_send; }
  QTextBrowser* transcript() const { return m_transcript; }
  QLabel* generatedModelNotice() const { return m_generatedNotice; }
  QComboBox* modelPicker() const { return m_model; }
  QLineEdit* systemPrompt() const { return m_systemPrompt; }
  QDoubleSpinBox* temperature() const { return m_temperature; }
  QSpinBox* maxTokens() const { return m_maxTokens; }
  QListWidget* conversationList() const { return m_list; }
  void setConfirmFunction(ConfirmFunction confirm) { m_confirm = std::move(confirm); }
  int conversationCount() const { return m_models.size(); }
  // Shows or hides the reasoning of message row of the current conversation.
  void setReasoningExpanded(int row, bool expanded);

 signals:
  // model: the id the request names (the embedded model's or a backend's).
  // sampling: max_tokens and temperature, as the request body names them.
  void sendRequested(const QString& conversation, const QJsonArray& messages, const QJsonObject& sampling, const QString& model);
  void stopRequested(const QString& conversation);

 public slots:
  void newConversation();
  // Names the current conversation in the list (the list's editor; empty: its first message again).
  void renameConversation();
  // Asks, stops its answer if one streams, and forgets the current conversation.
  void deleteConversation();
  // Copies answer row's text (its reasoning left out) to the clipboard.
  void copyAnswer(int row);
  // Asks the last answer again from the same messages (the previous answer is dropped).
  void regenerate();
  // Sends the input box's text in the current conversation (Ctrl+Return).
  void send();
  // Stops the current conversation's answer (Esc).
  void stop();
  void onDelta(const ChatDelta& delta);
  void onFinished(const ChatTurnStats& stats);
  void setEngineReady(bool ready);
  // Shows, above the transcript, that the embedded model is the generated one (random weights) and how to load a real one.
  void setGeneratedModelNotice(bool generated);
  // The models a conversation can talk to: the embedded one first, then every backend's.
  void setModels(const QStringList& models);

 private:
  void selectConversation(const QString& id);
  void scheduleRender();
  void render();
  void onAnchor(const QUrl& url);
  void updateButtons();
  // The current conversation's options into the editors, and the editors' into it.
  void loadOptions();
  void storeOptions();
  void addListItem(ChatModel* model);

  QHash<QString, ChatModel*> m_models;
  QString m_current;
  QSet<QString> m_expanded;  // "conversation/row" whose reasoning is shown
  QListWidget* m_list;
  QTextBrowser* m_transcript;
  QLabel* m_generatedNotice;
  QPlainTextEdit* m_input;
  QStringList m_images;       // the next message's images, data: URLs
  QLabel* m_imagesLabel;      // says how many are attached
  QPushButton* m_attach;
  QPushButton* m_clearImages;
  QSpinBox* m_maxTokens;
  QLineEdit* m_systemPrompt;
  QDoubleSpinBox* m_temperature;
  QPushButton* m_rename;
  QPushButton* m_delete;
  ConfirmFunction m_confirm = askConfirmation;
  QComboBox* m_model;
  QPushButton* m_send;
  QPushButton* m_stop;
  QTimer* m_renderTimer;
  bool m_ready = false;
  int m_counter = 0;
};
